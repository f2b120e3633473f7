"""Callbacks of a training run: TensorBoard, checkpoints, fault tolerance, validation BLEU."""

import importlib.util
import json
import logging
import os

import keras
import sacrebleu

logger = logging.getLogger(__name__)

# Extensions `BleuCallback` knows how to save the best model to.
_MODEL_SUFFIX = ".keras"
_WEIGHTS_SUFFIX = ".weights.h5"


class BleuCallback(keras.callbacks.Callback):
    """Computes corpus BLEU on a validation sample and keeps the best model.

    Every `every_n_epochs` epochs it translates `sources` with the injected `translate_fn`
    and scores the output against `references` with sacrebleu's default (cased,
    `13a`-tokenized) corpus BLEU on detokenized text, the number papers report as
    "sacreBLEU". The score goes into the epoch `logs` as `val_bleu`, so callbacks after
    this one in the list (`ModelCheckpoint(monitor="val_bleu")`, `TensorBoard`, the
    progress bar, `History`) see it. When the score beats the best so far and `best_path`
    is set, the model is saved there. The best score is kept next to it in
    `<best_path>.json`, so a run resumed by `BackupAndRestore` does not overwrite a better
    model with a worse one.

    Training code never imports decoding code: the caller builds `translate_fn` (e.g.
    greedy or beam search over `self.model`'s current weights) and passes it in.

    Args:
        translate_fn: callable `list[str] -> list[str]`, detokenized translations of
            detokenized source sentences, in order.
        sources: list of strings, validation source sentences.
        references: list of strings, their reference translations (same length).
        every_n_epochs: int, compute BLEU after every this many epochs. Defaults to `1`.
        best_path: string or `None`, where to save the best model: a `.keras` path saves
            the whole model, a `.weights.h5` path its weights; `None` saves nothing.
            Defaults to `None`.
        batch_size: int or `None`, translate this many sentences per call of
            `translate_fn`; `None` passes all at once. Defaults to `None`.
        verbose: int, `1` logs each score. Defaults to `1`.

    Example:

    >>> bleu = BleuCallback(translator, val_src, val_ref, best_path="run/best.keras")
    >>> model.fit(train_ds, epochs=10, callbacks=[bleu, *make_callbacks("run")])

    References:
        - [Post, 2018](https://aclanthology.org/W18-6319/), a call for clarity in
          reporting BLEU scores (sacreBLEU).
    """

    def __init__(
        self,
        translate_fn,
        sources,
        references,
        every_n_epochs=1,
        best_path=None,
        batch_size=None,
        verbose=1,
    ):
        super().__init__()
        if len(sources) != len(references):
            raise ValueError(
                "`sources` and `references` must have the same length. Received: "
                f"{len(sources)} sources, {len(references)} references"
            )
        if every_n_epochs < 1:
            raise ValueError(f"`every_n_epochs` must be >= 1. Received: {every_n_epochs}")
        if best_path is not None and not str(best_path).endswith(
            (_MODEL_SUFFIX, _WEIGHTS_SUFFIX)
        ):
            raise ValueError(
                f"`best_path` must end with {_MODEL_SUFFIX!r} or {_WEIGHTS_SUFFIX!r}. "
                f"Received: best_path={best_path!r}"
            )
        self.translate_fn = translate_fn
        self.sources = list(sources)
        self.references = list(references)
        self.every_n_epochs = every_n_epochs
        self.best_path = None if best_path is None else str(best_path)
        self.batch_size = batch_size
        self.verbose = verbose
        self.best_bleu = None

    @property
    def _record_path(self):
        return None if self.best_path is None else self.best_path + ".json"

    def on_train_begin(self, logs=None):
        if self._record_path and os.path.exists(self._record_path):
            with open(self._record_path, encoding="utf-8") as f:
                self.best_bleu = json.load(f)["val_bleu"]

    def compute_bleu(self):
        """Translates the validation sample and returns its corpus BLEU (0-100)."""
        step = self.batch_size or max(len(self.sources), 1)
        hypotheses = []
        for start in range(0, len(self.sources), step):
            hypotheses.extend(self.translate_fn(self.sources[start : start + step]))
        if len(hypotheses) != len(self.sources):
            raise ValueError(
                f"`translate_fn` returned {len(hypotheses)} translations for "
                f"{len(self.sources)} sources."
            )
        return sacrebleu.corpus_bleu(hypotheses, [self.references]).score

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every_n_epochs != 0:
            return
        bleu = self.compute_bleu()
        if logs is not None:
            logs["val_bleu"] = bleu
        improved = self.best_bleu is None or bleu > self.best_bleu
        if self.verbose:
            logger.info("Epoch %d: val_bleu = %.2f (best %s).", epoch + 1, bleu, self.best_bleu)
        if not improved:
            return
        self.best_bleu = bleu
        if self.best_path is None:
            return
        os.makedirs(os.path.dirname(os.path.abspath(self.best_path)), exist_ok=True)
        if self.best_path.endswith(_MODEL_SUFFIX):
            self.model.save(self.best_path)
        else:
            self.model.save_weights(self.best_path)
        with open(self._record_path, "w", encoding="utf-8") as f:
            json.dump({"val_bleu": bleu, "epoch": epoch + 1}, f)


def make_callbacks(
    output_dir,
    bleu_callback=None,
    best_monitor=None,
    best_mode=None,
    save_weights_only=False,
    tensorboard_update_freq="epoch",
    backup_save_freq="epoch",
    tensorboard=None,
):
    """The standard callbacks of a run, in the order `fit` must see them.

    - `bleu_callback` (if given) first, so `val_bleu` is in the epoch logs the others see;
    - `ModelCheckpoint` saving the latest model every epoch to
      `<output_dir>/checkpoints/last.keras` (or `last.weights.h5`), plus, if
      `best_monitor` is set (e.g. `"val_loss"` or `"val_bleu"`), the best one to
      `checkpoints/best.keras`;
    - `TensorBoard` writing under `<output_dir>/logs` (when the `tensorboard` package is
      installed: TensorFlow 2.21 no longer depends on it);
    - `BackupAndRestore` under `<output_dir>/backup`, last, so it backs up an epoch only
      after everything else has handled it. Rerunning the same `fit` call after the
      process was killed restores the weights, the optimizer state (step count, Adam
      moments) and the epoch, and continues from the last completed epoch. The backup is
      deleted when training finishes.

    Args:
        output_dir: string, the run directory.
        bleu_callback: a `BleuCallback` or `None`. Defaults to `None`.
        best_monitor: string or `None`, a logged quantity to keep the best checkpoint by.
            Defaults to `None` (keep only the latest).
        best_mode: string or `None`, `"auto"`, `"min"` or `"max"` for `best_monitor`.
            `None` means `"max"` for a BLEU monitor and Keras' `"auto"` otherwise
            (which would treat an unknown name like `val_bleu` as "lower is better").
            Defaults to `None`.
        save_weights_only: bool, save `.weights.h5` instead of `.keras` files.
            Defaults to `False`.
        tensorboard_update_freq: `"epoch"`, `"batch"` or int, how often TensorBoard
            writes. Defaults to `"epoch"`.
        backup_save_freq: `"epoch"` or int (batches), how often to back up.
            Defaults to `"epoch"`.
        tensorboard: bool or `None`, add the `TensorBoard` callback; `None` adds it if
            the `tensorboard` package is installed (and logs a warning if not); `True`
            raises if it is missing. Defaults to `None`.

    Returns:
        A list of `keras.callbacks.Callback`.

    Example:

    >>> callbacks = make_callbacks("runs/quick")
    >>> model.fit(train_ds, validation_data=val_ds, epochs=10, callbacks=callbacks)
    """
    if best_mode is None:
        best_mode = "max" if best_monitor and "bleu" in best_monitor else "auto"
    suffix = _WEIGHTS_SUFFIX if save_weights_only else _MODEL_SUFFIX
    checkpoint_dir = os.path.join(output_dir, "checkpoints")
    os.makedirs(checkpoint_dir, exist_ok=True)
    callbacks = [] if bleu_callback is None else [bleu_callback]
    callbacks.append(
        keras.callbacks.ModelCheckpoint(
            os.path.join(checkpoint_dir, "last" + suffix),
            save_weights_only=save_weights_only,
        )
    )
    if best_monitor is not None:
        callbacks.append(
            keras.callbacks.ModelCheckpoint(
                os.path.join(checkpoint_dir, "best" + suffix),
                monitor=best_monitor,
                mode=best_mode,
                save_best_only=True,
                save_weights_only=save_weights_only,
            )
        )
    tensorboard_installed = importlib.util.find_spec("tensorboard") is not None
    if tensorboard and not tensorboard_installed:
        raise ValueError("`tensorboard=True` but the `tensorboard` package is not installed.")
    if tensorboard is None and not tensorboard_installed:
        logger.warning("The `tensorboard` package is not installed: no TensorBoard logs.")
    if tensorboard_installed and tensorboard is not False:
        callbacks.append(
            keras.callbacks.TensorBoard(
                log_dir=os.path.join(output_dir, "logs"),
                update_freq=tensorboard_update_freq,
                profile_batch=0,
            )
        )
    callbacks.append(
        keras.callbacks.BackupAndRestore(
            os.path.join(output_dir, "backup"), save_freq=backup_save_freq
        )
    )
    return callbacks
