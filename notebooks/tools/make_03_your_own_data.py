"""Writes notebooks/03_your_own_data.ipynb (run from the repository root)."""

import nbformat as nbf

cells = []
md = lambda s: cells.append(nbf.v4.new_markdown_cell(s))  # noqa: E731
code = lambda s: cells.append(nbf.v4.new_code_cell(s))  # noqa: E731

md("""# 03 — Train on your own data: a French → English toy corpus

Your corpus is two text files per split, one sentence per line, line *i* of one translating
line *i* of the other (plain or `.gz`), or one TSV file `source<TAB>target`. This notebook
writes such files for a small invented French → English language (the adjective follows the
noun in French and precedes it in English, so the model must learn to reorder), then runs
the three steps of the README's "Train on your own data":

```
keras-transformer train --train train.fr train.en --valid val.fr val.en --test toy=test.fr,test.en --output run --set vocab_size=320
keras-transformer export --model run --out run/export
keras-transformer translate --export run/export < test.fr
```

here through the same Python functions the commands call, with a smaller model than those
commands train: they train the `quick` preset (d_model 256, 2 epochs, a 400-step warm-up),
too few updates for a corpus of 3,000 pairs. What this notebook runs is, as commands:

```
keras-transformer train --preset tiny --train train.fr train.en --valid val.fr val.en --test toy=test.fr,test.en --output run --set vocab_size=320 d_model=64 num_heads=4 ff_dim=256 num_layers=2 max_length=24 batch_size=64 tokens_per_batch=null train_subset=null steps_per_epoch=null epochs=10 warmup_steps=200 bleu_sentences=0 drop_long_pairs=true
keras-transformer export --model run --out run/export --checkpoint final --search greedy --max-input-length 24 --max-output-length 24
```

The languages come from the file names (`train.fr` → `fr`); the run directory and the export record them, so `translate` and
`evaluate` know the direction. The default vocabulary has 8,000 pieces: a corpus of few
distinct words (this toy one has about 50) cannot fill it, hence `--set vocab_size=320`.

CI runs this notebook with `KT_NOTEBOOK_CI=1`, which shrinks the corpus and the model to
seconds.""")

code("""import os

# Parameters: about two minutes on 2 CPU cores.
PAIRS = {"train": 3000, "val": 200, "test": 200}
EPOCHS = 10
LAYERS = 2
D_MODEL = 64
WORK_DIR = "../runs/notebook03"

if os.environ.get("KT_NOTEBOOK_CI"):   # CI: a few hundred pairs, a tiny model, seconds
    PAIRS = {"train": 300, "val": 40, "test": 40}
    EPOCHS, D_MODEL, LAYERS = 1, 16, 1
    WORK_DIR = "/tmp/kt_notebook03_ci"
""")

md("""## A parallel corpus in files
Article, noun, optional adjective, verb, optional adverb. French puts the adjective after the
noun; English before it.""")

code("""import pathlib
import random
import shutil

ARTICLES = {"le": "the", "un": "a"}
NOUNS = {"chat": "cat", "chien": "dog", "oiseau": "bird", "cheval": "horse", "garçon": "boy",
         "homme": "man", "poisson": "fish", "lapin": "rabbit"}
ADJECTIVES = {"noir": "black", "blanc": "white", "petit": "small", "grand": "big",
              "rouge": "red", "vieux": "old"}
VERBS = {"mange": "eats", "dort": "sleeps", "court": "runs", "saute": "jumps", "chante": "sings",
         "nage": "swims"}
ADVERBS = {"vite": "fast", "ici": "here", "souvent": "often", "bien": "well"}


def sentence_pair(rng):
    article, noun, verb = (rng.choice(list(words)) for words in (ARTICLES, NOUNS, VERBS))
    adjective = rng.choice(list(ADJECTIVES)) if rng.random() < 0.6 else None
    adverb = rng.choice(list(ADVERBS)) if rng.random() < 0.5 else None
    french = [article, noun] + ([adjective] if adjective else []) + [verb] + ([adverb] if adverb else [])
    english = [ARTICLES[article]] + ([ADJECTIVES[adjective]] if adjective else []) + [NOUNS[noun], VERBS[verb]]
    english += [ADVERBS[adverb]] if adverb else []
    return " ".join(french) + ".", " ".join(english) + "."


shutil.rmtree(WORK_DIR, ignore_errors=True)
data_dir = pathlib.Path(WORK_DIR, "data")
data_dir.mkdir(parents=True)
rng = random.Random(0)
files = {}
for split, count in PAIRS.items():
    pairs = [sentence_pair(rng) for _ in range(count)]
    for lang, side in (("fr", 0), ("en", 1)):
        (data_dir / f"{split}.{lang}").write_text("".join(p[side] + "\\n" for p in pairs), encoding="utf-8")
    files[split] = [str(data_dir / f"{split}.fr"), str(data_dir / f"{split}.en")]
print(open(files["train"][0]).readlines()[:3], open(files["train"][1]).readlines()[:3])""")

md("""## 1. Train
`data="files"` with the files of each split is what `keras-transformer train --train ...
--valid ... --test NAME=SRC,TGT` puts in the run's config. Before training the trainer
checks the files (line counts, empty files, encoding), prints the data report (pairs read,
kept, dropped and why) and counts the batches of an epoch, so the progress shows a total.

The vocabulary normalizes text before it splits it, and the model reads and writes text
through it. The default (`normalization="nmt_nfkc"`, SentencePiece's) folds compatibility
characters and turns zero-width characters and bidi marks into spaces: for Persian (its
zero-width non-joiner) or right-to-left text with bidi marks set `normalization="nfkc"`,
to keep full-width CJK punctuation `"identity"`; for Chinese or Japanese (thousands of
characters) `character_coverage=0.9995` spells the rarest characters in bytes.""")

code("""from keras_transformer.training import get_preset
from keras_transformer.training.trainer import train

config = get_preset("tiny").replace(
    data="files",
    data_files={"train": files["train"], "validation": files["val"], "toy": files["test"]},
    source_lang="fr", target_lang="en",
    # About 60 pieces beside the 256 byte pieces: every toy word is one piece.
    vocab_size=320, d_model=D_MODEL, num_heads=4, ff_dim=4 * D_MODEL, num_layers=LAYERS,
    max_length=24, batch_size=64, tokens_per_batch=None, train_subset=None,
    steps_per_epoch=None, epochs=EPOCHS, warmup_steps=200, bleu_sentences=0,
    drop_long_pairs=True)
run = train(config, os.path.join(WORK_DIR, "run"), report_padding=False, verbose=2)
print(open(os.path.join(WORK_DIR, "run", "data_report.json")).read()[:400])""")

md("""## 2. Export
The SavedModel carries the direction: a `metadata` signature answers with the source and
target languages and the data source (TF Serving clients can call it too).""")

code("""import tensorflow as tf

from keras_transformer.export import DecodingConfig, export_run

# As `keras-transformer export` does: the run's direction and data files go with it.
export_dir = export_run(os.path.join(WORK_DIR, "run"), os.path.join(WORK_DIR, "export"),
                        checkpoint="final", decoding=DecodingConfig.for_export(
                            search="greedy", max_input_length=24, max_output_length=24))
loaded = tf.saved_model.load(str(export_dir))
{k: v.numpy().decode() for k, v in loaded.signatures["metadata"]().items()}""")

md("""## 3. Translate
With the exported SavedModel alone, as `keras-transformer translate --export ...` does.""")

code("""from keras_transformer.export.inference import ExportedTranslator, evaluate_translations

exported = ExportedTranslator(export_dir)
sources = [line.rstrip("\\n") for line in open(files["test"][0], encoding="utf-8")]
references = [line.rstrip("\\n") for line in open(files["test"][1], encoding="utf-8")]
hypotheses = exported(sources)
for source, hypothesis, reference in list(zip(sources, hypotheses, references))[:5]:
    print(f"FR : {source}\\nOUT: {hypothesis}\\nREF: {reference}\\n")
print(f"BLEU on the toy test set: {evaluate_translations(hypotheses, references)['bleu']:.1f}")""")

nb = nbf.v4.new_notebook(cells=cells, metadata={
    "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
    "language_info": {"name": "python"}})
nbf.write(nb, "notebooks/03_your_own_data.ipynb")
