import nbformat as nbf

cells = []
md = lambda s: cells.append(nbf.v4.new_markdown_cell(s))
code = lambda s: cells.append(nbf.v4.new_code_cell(s))

md("""# 01 — Training a Transformer on Multi30K with `model.fit`

English → German on Multi30K (29,000 training pairs): load the data through TFDS, train a
shared SentencePiece vocabulary, build the tf.data pipeline, build the model with
`build_transformer`, train it with `model.fit` (masked label-smoothed loss, the paper's
warm-up schedule, Adam β2 = 0.98), plot the learning curves, and translate a few held-out
sentences with cached beam search inside the graph. The last section shows the reference
recipe's run (`keras-transformer train --preset multi30k`): its learning curves over the
whole run and its translations.

The parameters are at the top; CI runs this notebook with `KT_NOTEBOOK_CI=1`, which shrinks
them to seconds (and skips the reference run). The outputs committed with the notebook come
from a real run on the project's 2-core machine: the `quick` preset's 2 epochs here, and the
reference run of `benchmarks/RESULTS.md`.""")

code("""import os

# Parameters: the `quick` preset (d_model 256, 2+2 layers), its 2 epochs: about 7 minutes on 2 CPU cores.
PRESET = "quick"
EPOCHS = 2
TRAIN_SUBSET = None          # e.g. 5000 for a faster look; None = all 29,000 pairs
OUTPUT_DIR = "../runs/notebook01"
BEAM_SIZE = 4
# A finished run of `keras-transformer train --preset multi30k --output runs/multi30k`.
REFERENCE_RUN = os.environ.get("KT_REFERENCE_RUN", "../runs/multi30k")

if os.environ.get("KT_NOTEBOOK_CI"):   # CI: tiny model, a few hundred pairs, seconds
    PRESET, EPOCHS, TRAIN_SUBSET, BEAM_SIZE = "tiny", 2, 400, 2
    OUTPUT_DIR = "/tmp/kt_notebook01_ci"
    REFERENCE_RUN = None
""")

code("""import shutil

import keras
import matplotlib.pyplot as plt

from keras_transformer import build_transformer
from keras_transformer.data import compare_padding, load_multi30k, make_translation_dataset
from keras_transformer.export import DecodingConfig, Translator
from keras_transformer.text import train_tokenizers
from keras_transformer.training import (MaskedAccuracy, MaskedSparseCategoricalCrossentropy,
                                        get_preset, make_optimizer)
from keras_transformer.training.schedules import cooldown_steps

plt.rcParams["figure.dpi"] = 72      # small PNGs in the committed notebook
config = get_preset(PRESET).replace(epochs=EPOCHS, train_subset=TRAIN_SUBSET, steps_per_epoch=None)
keras.utils.set_random_seed(config.seed)
shutil.rmtree(OUTPUT_DIR, ignore_errors=True)
config""")

md("""## Data through TFDS
`load_multi30k` prepares the `multi30k/en-de` TFDS dataset from the local copy of the raw
files (found automatically) or downloads them.""")

code("""train_pairs = load_multi30k("train")
val_pairs = load_multi30k("validation")
test_pairs = load_multi30k("test_2016")
if config.train_subset:
    train_pairs = train_pairs.take(config.train_subset)
for example in train_pairs.take(2).as_numpy_iterator():
    print(example["en"].decode(), "->", example["de"].decode())""")

md("""## A shared SentencePiece vocabulary, in the graph
One vocabulary for both languages (so the embedding and the output projection can be one
tied matrix); tokenization runs as TensorFlow ops.""")

code("""tokenizer, _ = train_tokenizers(train_pairs, "en", "de", vocab_size=config.vocab_size,
                                output_dir=os.path.join(OUTPUT_DIR, "tokenizer"))
ids = tokenizer.tokenize(["Two dogs are playing in the snow."], add_end=True)
print(ids.to_list(), tokenizer.id_to_piece(ids.flat_values).numpy())
print(tokenizer.detokenize(ids).numpy())""")

md("""## The input pipeline
Bucketing by length with token-based batches cuts the padding; decoder inputs are the
targets shifted right behind a start token.""")

code("""batching = dict(max_length=config.max_length, batch_size=config.batch_size or 64,
                tokens_per_batch=config.tokens_per_batch)
train_ds = make_translation_dataset(train_pairs, tokenizer, tokenizer, seed=config.seed, **batching)
val_ds = make_translation_dataset(val_pairs, tokenizer, tokenizer, shuffle=False, **batching)
print(compare_padding(train_pairs, tokenizer, tokenizer, num_batches=20, max_length=config.max_length,
                      batch_size=64, tokens_per_batch=config.tokens_per_batch or 1024, seed=0))
inputs, labels = next(iter(train_ds))
print({k: v.shape for k, v in inputs.items()}, labels.shape)""")

md("## The model and `model.fit`")

md("""The learning rate warms up, decays as 1/sqrt(step), and in the preset's last 30% of the
updates cools down linearly to zero (`lr_cooldown`), which needs the run's length: the
batches of one pass over the data, times the epochs. Gradients are clipped to a global norm
of 1 (`global_clipnorm`).""")

code("""model = build_transformer(vocab_size=tokenizer.vocab_size, d_model=config.d_model,
                          num_heads=config.num_heads, ff_dim=config.ff_dim,
                          num_layers=config.num_layers, dropout=config.dropout,
                          norm_first=config.norm_first, tie_embeddings=config.tie_embeddings)
steps_per_epoch = int(train_ds.reduce(0, lambda count, batch: count + 1))  # one pass
total_steps = config.epochs * steps_per_epoch
cooldown = cooldown_steps(config.lr_cooldown, total_steps)  # the last 30%
model.compile(optimizer=make_optimizer(config.d_model, config.warmup_steps, scale=config.lr_scale,
                                       total_steps=total_steps if cooldown else None,
                                       cooldown_steps=cooldown,
                                       global_clipnorm=config.global_clipnorm),
              loss=MaskedSparseCategoricalCrossentropy(label_smoothing=config.label_smoothing),
              metrics=[MaskedAccuracy()])
print(f"{model.count_params():,} parameters; {steps_per_epoch} batches an epoch; the learning "
      f"rate warms up over {config.warmup_steps} updates and cools down to 0 over the last "
      f"{cooldown} of {total_steps}")
history = model.fit(train_ds, validation_data=val_ds, epochs=config.epochs,
                    callbacks=[keras.callbacks.BackupAndRestore(os.path.join(OUTPUT_DIR, "backup"))])""")

code("""fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(9, 3))
epochs = range(1, len(history.history["loss"]) + 1)
ax_loss.plot(epochs, history.history["loss"], "o-", label="train")
ax_loss.plot(epochs, history.history["val_loss"], "o-", label="validation")
ax_loss.set(xlabel="epoch", ylabel="label-smoothed loss", title="Loss")
ax_acc.plot(epochs, history.history["masked_accuracy"], "o-", label="train")
ax_acc.plot(epochs, history.history["val_masked_accuracy"], "o-", label="validation")
ax_acc.set(xlabel="epoch", ylabel="token accuracy", title="Masked accuracy")
for ax in (ax_loss, ax_acc):
    ax.legend()
fig.tight_layout()
fig.savefig(os.path.join(OUTPUT_DIR, "learning_curves.png"))""")

md("""## Translations
The `Translator` runs tokenization, the encoder once, cached decoder steps and beam search in
one graph — the same function the exported SavedModel serves.""")

code("""translator = Translator(model, tokenizer, tokenizer,
                        DecodingConfig(search="beam", beam_size=BEAM_SIZE, max_output_length=64))
examples = list(test_pairs.take(5).as_numpy_iterator())
for example, translation in zip(examples, translator([e["en"].decode() for e in examples])):
    print("EN :", example["en"].decode())
    print("OUT:", translation)
    print("REF:", example["de"].decode(), "\\n")
model.save(os.path.join(OUTPUT_DIR, "model.keras"))""")

md("""## The reference recipe's run
The `multi30k` preset trained for a fixed 16 epochs, `keras-transformer train --preset multi30k
--output runs/multi30k --set epochs=16 time_budget_minutes=null` (session 57's run in
`benchmarks/RESULTS.md`; the preset's own command trains for its 55-minute budget instead). Its `history.json` holds every epoch's
logs and wall time; validation BLEU (greedy, 500 sentences) every second epoch picked
`checkpoints/best.keras`, and `keras-transformer average` wrote the mean of the last 5 epochs
to `checkpoints/averaged.keras`.""")

code("""import json
import pathlib

import numpy as np

from keras_transformer.export import load_run

reference = pathlib.Path(REFERENCE_RUN) if REFERENCE_RUN else None
if reference is None or not (reference / "history.json").is_file():
    print(f"No finished reference run at {REFERENCE_RUN}: train one with "
          "`keras-transformer train --preset multi30k --output runs/multi30k`.")
else:
    record = json.loads((reference / "history.json").read_text())
    logs, minutes = record["history"], np.cumsum(record["epoch_seconds"]) / 60
    fig, (ax_loss, ax_bleu) = plt.subplots(1, 2, figsize=(9, 3))
    ax_loss.plot(minutes, logs["loss"], "o-", label="train")
    ax_loss.plot(minutes, logs["val_loss"], "o-", label="validation")
    ax_loss.set(xlabel="training minutes", ylabel="label-smoothed loss", title="Loss")
    ax_loss.legend()
    scored = [(m, b) for m, b in zip(minutes, logs.get("val_bleu", [])) if b is not None]
    ax_bleu.plot(*zip(*scored), "o-")
    ax_bleu.set(xlabel="training minutes", ylabel="BLEU", title="Validation BLEU (greedy, 500 sentences)")
    fig.tight_layout()
    print(f"{record['epochs']} epochs in {record['train_seconds'] / 60:.1f} minutes of training")""")

code("""if reference is not None and (reference / "history.json").is_file():
    checkpoint = "averaged" if (reference / "checkpoints" / "averaged.keras").is_file() else "best"
    reference_model, source_tokenizer, target_tokenizer, _ = load_run(reference, checkpoint)
    reference_translator = Translator(
        reference_model, source_tokenizer, target_tokenizer,
        DecodingConfig(search="beam", beam_size=4, max_output_length=64))
    print(f"checkpoint: {checkpoint}\\n")
    for example, translation in zip(
            examples, reference_translator([e["en"].decode() for e in examples])):
        print("EN :", example["en"].decode())
        print("OUT:", translation)
        print("REF:", example["de"].decode(), "\\n")""")

nb = nbf.v4.new_notebook(cells=cells, metadata={"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}, "language_info": {"name": "python"}})
nbf.write(nb, "notebooks/01_train_multi30k.ipynb")
