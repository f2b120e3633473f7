"""One training run end to end: data, tokenizers, model, `model.fit` under a strategy.

The run directory layout is the contract with export (see `keras_transformer/export/run.py`):
`config.json`, `data_report.json`, `tokenizer/`, `checkpoints/{last,best}.keras`, `logs/`,
`backup/`, `model.keras`, `history.json`.
"""

import dataclasses
import itertools
import json
import logging
import pathlib
import sys
import time

import keras
import numpy as np

from keras_transformer.data import compare_padding, make_translation_dataset
from keras_transformer.data.preparation import (
    CACHE_MAX_PAIRS,
    open_run_source,
    prepare_data_report,
)
from keras_transformer.model import build_transformer
from keras_transformer.text import load_tokenizers, train_tokenizers
from keras_transformer.training.callbacks import BleuCallback, make_callbacks
from keras_transformer.training.losses import MaskedSparseCategoricalCrossentropy
from keras_transformer.training.metrics import MaskedAccuracy
from keras_transformer.training.optimizers import make_optimizer
from keras_transformer.training.strategy import select_strategy

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainingRun:
    """What `train` returns: the trained model, its tokenizers and where things are."""

    model: keras.Model
    source_tokenizer: object
    target_tokenizer: object
    config: object
    output_dir: pathlib.Path
    history: dict
    train_seconds: float


def _pairs(dataset, source_lang, target_lang, limit=None):
    """Python lists `(sources, references)` of a split of `{lang: string}` examples."""
    if limit:
        dataset = dataset.take(limit)
    sources, references = [], []
    for example in dataset.as_numpy_iterator():
        sources.append(example[source_lang].decode("utf-8"))
        references.append(example[target_lang].decode("utf-8"))
    return sources, references


def prepare_tokenizers(config, train_split, output_dir):
    """Loads the run's tokenizers, training them on the train split the first time."""
    directory = pathlib.Path(output_dir) / "tokenizer"
    try:
        tokenizers = load_tokenizers(directory)
        logger.info("Reusing the tokenizer in %s", directory)
        return tokenizers
    except FileNotFoundError:
        pass
    started = time.time()
    tokenizers = train_tokenizers(
        train_split,
        config.source_lang,
        config.target_lang,
        vocab_size=config.vocab_size,
        shared=config.shared_vocabulary,
        output_dir=directory,
        max_pairs=config.tokenizer_sample_pairs,
        seed=config.seed,
    )
    print(f"Trained a {config.vocab_size}-piece {'shared' if config.shared_vocabulary else 'separate'}"
          f" SentencePiece vocabulary in {time.time() - started:.1f}s -> {directory}", flush=True)
    return tokenizers


def build_model(config, source_tokenizer, target_tokenizer):
    """`build_transformer` from a `TrainingConfig` and the tokenizers' vocabulary sizes."""
    shared = source_tokenizer is target_tokenizer
    return build_transformer(
        vocab_size=source_tokenizer.vocab_size,
        target_vocab_size=None if shared else target_tokenizer.vocab_size,
        d_model=config.d_model,
        num_heads=config.num_heads,
        ff_dim=config.ff_dim,
        num_layers=config.num_layers,
        num_decoder_layers=config.num_decoder_layers,
        dropout=config.dropout,
        norm_first=config.norm_first,
        tie_embeddings=config.tie_embeddings,
        max_length=max(config.max_length, 512),
    )


def compile_model(model, config):
    """Compiles with the masked label-smoothed loss, masked accuracy and the warm-up Adam."""
    model.compile(
        optimizer=make_optimizer(
            config.d_model, config.warmup_steps, scale=config.lr_scale, clipnorm=config.clipnorm
        ),
        loss=MaskedSparseCategoricalCrossentropy(label_smoothing=config.label_smoothing),
        metrics=[MaskedAccuracy()],
    )
    return model


def make_datasets(config, splits, source_tokenizer, target_tokenizer, replicas=1,
                  data_report=None):
    """The training and validation `tf.data` pipelines of a run.

    With a `data_report` (see `keras_transformer.data.prepare_data_report`) over-long pairs
    are dropped as the report counted them, each pass declares its number of batches (a
    progress bar with a total), and the tokenized training set is cached in memory only
    when it is small enough (`CACHE_MAX_PAIRS`).
    """
    batching = dict(
        max_length=config.max_length,
        batch_size=config.batch_size or 64,
        tokens_per_batch=config.tokens_per_batch,
        bucket_boundaries=config.bucket_boundaries,
        batch_multiple=replicas,
        source_lang=config.source_lang,
        target_lang=config.target_lang,
    )
    train = splits["train"]
    if config.train_subset:
        train = train.take(config.train_subset)
    counted = {}
    if data_report is not None:
        batching["drop_long"] = config.drop_long_pairs
        counted = data_report.batches
    train_ds = make_translation_dataset(
        train, source_tokenizer, target_tokenizer, shuffle=True, seed=config.seed,
        repeat=config.steps_per_epoch is not None, num_batches=counted.get("train"),
        cache=data_report is None or data_report.kept("train") <= CACHE_MAX_PAIRS,
        **batching,
    )
    val_ds = None
    if splits.get("validation") is not None:
        val_ds = make_translation_dataset(
            splits["validation"], source_tokenizer, target_tokenizer, shuffle=False,
            num_batches=counted.get("validation"),
            cache=data_report is None or data_report.kept("validation") <= CACHE_MAX_PAIRS,
            **batching,
        )
    return train, train_ds, val_ds


def train(
    config,
    output_dir,
    data_dir=None,
    local_dir=None,
    strategy="auto",
    make_translate_fn=None,
    report_padding=True,
    verbose="auto",
):
    """Trains a Transformer on the config's data source with `model.fit`; writes a run dir.

    The data source is `config.data` (Multi30K, parallel files, TSV or a TFDS dataset, see
    `keras_transformer.data.sources`). Before training, its files are checked, and a data
    report (pairs read, kept, dropped and why; batches per epoch) is printed and saved as
    `data_report.json`; the epoch's batch count gives the progress bar its total.

    Rerunning the same call after the process died resumes from the last completed epoch
    (`BackupAndRestore`): weights, optimizer state and epoch counter are restored, and the
    tokenizer trained by the first attempt is reused.

    Args:
        config: `TrainingConfig`.
        output_dir: str or path-like, the run directory (created).
        data_dir: TFDS data directory (for `tfds:<name>` data). Defaults to TFDS' own.
        local_dir: directory holding the raw Multi30K files; found automatically when
            `None` (see `keras_transformer.data.find_local_multi30k`).
        strategy: a `tf.distribute.Strategy` or a name for `select_strategy`
            (`"auto"`, `"default"`, `"mirrored"`, `"multi_worker"`). Defaults to `"auto"`.
        make_translate_fn: optional callable `(model, source_tokenizer, target_tokenizer)
            -> translate_fn(list[str]) -> list[str]` for validation BLEU (the caller
            injects decoding, so training does not import it). `None` skips BLEU.
        report_padding: bool, print the padding fraction with and without bucketing.
        verbose: Keras `fit` verbosity. Defaults to `"auto"`: the progress bar on a
            terminal, one line per epoch otherwise (no stream of `\r` and ANSI codes in a
            log file).

    Returns:
        A `TrainingRun`.
    """
    output_dir = pathlib.Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(config.seed)
    if config.precision:
        keras.config.set_dtype_policy(config.precision)
    if isinstance(strategy, str):
        strategy = select_strategy(strategy)
    replicas = strategy.num_replicas_in_sync
    source = open_run_source(config, local_dir=local_dir, tfds_dir=data_dir)
    # A TFDS source may have chosen the languages: the run records the ones used.
    config = config.replace(source_lang=source.source_lang, target_lang=source.target_lang)
    (output_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2))

    splits = {split: source.dataset(split) if split in source.splits() else None
              for split in ("train", "validation")}
    source_tokenizer, target_tokenizer = prepare_tokenizers(
        config, itertools.islice(source.pairs("train"), config.train_subset), output_dir)
    data_report = prepare_data_report(
        source, config, source_tokenizer, target_tokenizer, output_dir, replicas)
    print(data_report, flush=True)
    train_pairs, train_ds, val_ds = make_datasets(
        config, splits, source_tokenizer, target_tokenizer, replicas, data_report
    )
    if verbose == "auto":
        verbose = 1 if getattr(sys.stdout, "isatty", lambda: False)() else 2
    if report_padding:
        report = compare_padding(
            train_pairs, source_tokenizer, target_tokenizer, num_batches=30,
            max_length=config.max_length, batch_size=config.batch_size or 64,
            tokens_per_batch=config.tokens_per_batch or 2048, seed=config.seed,
            source_lang=config.source_lang, target_lang=config.target_lang,
        )
        print(f"Padding per batch: {report}", flush=True)

    with strategy.scope():
        model = compile_model(build_model(config, source_tokenizer, target_tokenizer), config)
    print(f"Model: {model.count_params():,} parameters; strategy "
          f"{type(strategy).__name__} with {replicas} replica(s); policy "
          f"{keras.config.dtype_policy().name}", flush=True)

    bleu_callback = None
    if make_translate_fn is not None and config.bleu_sentences and splits["validation"]:
        sources, references = _pairs(
            splits["validation"], config.source_lang, config.target_lang, config.bleu_sentences
        )
        bleu_callback = BleuCallback(
            make_translate_fn(model, source_tokenizer, target_tokenizer),
            sources,
            references,
            every_n_epochs=config.bleu_every_n_epochs,
            best_path=str(output_dir / "checkpoints" / "best.keras"),
        )
    callbacks = make_callbacks(
        str(output_dir),
        bleu_callback=bleu_callback,
        best_monitor=None if bleu_callback else ("val_loss" if val_ds is not None else "loss"),
    )
    started = time.time()
    history = model.fit(
        train_ds,
        validation_data=val_ds,
        epochs=config.epochs,
        steps_per_epoch=config.steps_per_epoch,
        callbacks=callbacks,
        verbose=verbose,
    )
    train_seconds = time.time() - started
    model.save(output_dir / "model.keras")
    history_dict = {k: [float(v) for v in values] for k, values in history.history.items()}
    (output_dir / "history.json").write_text(
        json.dumps({"history": history_dict, "train_seconds": train_seconds}, indent=2)
    )
    return TrainingRun(
        model=model,
        source_tokenizer=source_tokenizer,
        target_tokenizer=target_tokenizer,
        config=config,
        output_dir=output_dir,
        history=history_dict,
        train_seconds=train_seconds,
    )


def training_tokens_per_second(model, dataset, steps=20, warmup_steps=3):
    """Real (non-padding) target tokens per second of `train_on_batch` over `steps` batches."""
    iterator = iter(dataset.repeat())
    for _ in range(warmup_steps):
        inputs, labels = next(iterator)
        model.train_on_batch(inputs, labels)
    tokens, started = 0, time.time()
    for _ in range(steps):
        inputs, labels = next(iterator)
        model.train_on_batch(inputs, labels)
        tokens += int(np.count_nonzero(labels.numpy())) + int(
            np.count_nonzero(inputs["encoder_tokens"].numpy())
        )
    return tokens / (time.time() - started)


__all__ = ["TrainingRun", "build_model", "compile_model", "make_datasets",
           "prepare_tokenizers", "train", "training_tokens_per_second"]
