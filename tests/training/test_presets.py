"""TrainingConfig: documented fields, presets, validation, files and overrides."""

import dataclasses
import json
import pathlib

import pytest

from keras_transformer.training.presets import (
    PRESETS, TrainingConfig, get_preset, parse_overrides,
)


def test_every_field_is_documented():
    for field in dataclasses.fields(TrainingConfig):
        help_text = field.metadata.get("help", "")
        assert len(help_text) > 15, f"field {field.name!r} has no help text"


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_valid_and_json_serializable(name):
    config = get_preset(name)
    assert isinstance(config, TrainingConfig)
    assert TrainingConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


def test_quick_and_reference_presets_share_a_vocabulary():
    for name in ("quick", "multi30k"):
        config = get_preset(name)
        assert config.shared_vocabulary and config.tie_embeddings
        assert 8000 <= config.vocab_size <= 10000


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ValueError, match="'huge'.*multi30k, quick, tiny"):
        get_preset("huge")


def test_replace_overrides_and_validates():
    config = get_preset("tiny").replace(epochs=3, bucket_boundaries=[4, 8])
    assert config.epochs == 3 and config.bucket_boundaries == (4, 8)
    assert get_preset("tiny").epochs == 1
    with pytest.raises(ValueError, match="Unknown TrainingConfig field"):
        config.replace(learning_rate=1.0)
    with pytest.raises(ValueError, match="divisible"):
        config.replace(num_heads=3)
    # Refused here, not after the vocabulary and the data pass (with advice to set
    # learned_positions, which training does not offer).
    with pytest.raises(ValueError, match=r"`d_model` must be even.*d_model=63") as error:
        config.replace(d_model=63, num_heads=1)
    assert "learned_positions" not in str(error.value)
    with pytest.raises(ValueError, match="precision"):
        config.replace(precision="float16")
    with pytest.raises(ValueError, match=r"normalization.*'nmt_nfkc', 'nfkc', 'identity'"):
        config.replace(normalization="nfc")
    for coverage in (0.9, 1.5):
        with pytest.raises(ValueError, match=r"character_coverage.*\[0\.98, 1\]"):
            config.replace(character_coverage=coverage)
    with pytest.raises(ValueError, match="exactly one"):
        config.replace(tokens_per_batch=512)
    for late in ({"late_dropout": 1.0, "dropout": 0.1, "late_dropout_after": 3},
                 {"late_dropout": 0.3, "dropout": 0.0, "late_dropout_after": 3},
                 {"late_dropout": 0.3, "dropout": 0.1, "late_dropout_after": 0},
                 {"late_dropout_min_epochs": -1}):
        with pytest.raises(ValueError, match="late_dropout"):
            config.replace(**late)


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_file_round_trip(tmp_path, suffix):
    config = get_preset("quick").replace(precision="mixed_bfloat16", bucket_boundaries=(8, 16))
    path = tmp_path / f"config{suffix}"
    config.to_file(path)
    assert TrainingConfig.from_file(path) == config


def test_from_file_with_preset_and_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("preset: multi30k\nepochs: 2\nseed: 7\n")
    config = TrainingConfig.from_file(path)
    assert config == get_preset("multi30k").replace(epochs=2, seed=7)
    path.write_text('{"preset": "quick", "d_modle": 4}')
    with pytest.raises(ValueError, match="d_modle"):
        TrainingConfig.from_file(path)


def test_reference_recipe_raises_dropout_only_in_runs_of_30_epochs_or_more():
    # 40 epochs gained from late dropout, 25 lost (benchmarks/RESULTS.md, session 31).
    config = get_preset("multi30k")
    assert (config.dropout, config.late_dropout, config.late_dropout_after) == (0.1, 0.3, 12)
    assert config.late_dropout_min_epochs == 30


def test_reference_recipe_samples_subword_segmentations_and_quick_does_not():
    # 16-best, alpha 0.3: 40.85 validation BLEU where the same recipe without it had
    # 39.78-40.10; in quick's 2 epochs it lost (22.60 against 23.87; benchmarks/RESULTS.md,
    # session 32).
    config = get_preset("multi30k")
    assert (config.subword_nbest, config.subword_alpha) == (16, 0.3)
    assert get_preset("quick").subword_nbest == 1 == get_preset("tiny").subword_nbest


def test_overrides_read_json_values_and_keep_other_text():
    overrides = parse_overrides(["epochs=3", "late_dropout=null", "bucket_boundaries=[8, 16]",
                                 "source_lang=de=x"])
    assert overrides == {"epochs": 3, "late_dropout": None, "bucket_boundaries": [8, 16],
                         "source_lang": "de=x"}
    overrides.pop("source_lang")
    assert get_preset("tiny").replace(**overrides).bucket_boundaries == (8, 16)
    with pytest.raises(ValueError, match="FIELD=VALUE, got 'epochs'"):
        parse_overrides(["epochs"])


def test_data_files_are_kept_as_json_holds_them(tmp_path, monkeypatch):
    # Tuples compared unequal to the run's lists (resuming refused, "changed" data_files);
    # Path objects could not be written to config.json; relative paths broke the run from
    # another working directory.
    tmp_path = tmp_path.resolve()  # paths are recorded with symlinks resolved
    monkeypatch.chdir(tmp_path)
    config = get_preset("tiny").replace(data="files", data_files={
        "train": ("data/train.fr", pathlib.Path("data/train.en")),
        "news": [tmp_path / "news.fr", "~/news.en"]})
    assert config.data_files == {
        "train": [str(tmp_path / "data/train.fr"), str(tmp_path / "data/train.en")],
        "news": [str(tmp_path / "news.fr"), str(pathlib.Path.home().resolve() / "news.en")]}
    for suffix in (".json", ".yaml"):
        config.to_file(tmp_path / f"config{suffix}")
        assert TrainingConfig.from_file(tmp_path / f"config{suffix}") == config
    tsv = get_preset("tiny").replace(data="tsv", data_files={"train": pathlib.Path("x.tsv")})
    assert tsv.data_files == {"train": str(tmp_path / "x.tsv")}
    with pytest.raises(ValueError, match=r"data_files\['train'\]. must hold file paths"):
        get_preset("tiny").replace(data="tsv", data_files={"train": 3})


def test_two_names_of_the_validation_split_are_refused():
    # `sources` maps every alias to "validation": one of the two was silently dropped.
    with pytest.raises(ValueError, match=r"validation split 2 times \(\['dev', 'validation'\]\)"):
        get_preset("tiny").replace(data="tsv", data_files={
            "train": "t.tsv", "validation": "v.tsv", "dev": "d.tsv"})


@pytest.mark.parametrize("field, value", [
    ("subword_nbest", 513), ("subword_nbest", 0), ("subword_alpha", float("inf")),
    ("subword_alpha", -0.1),
])
def test_subword_sampling_settings_sentencepiece_cannot_use_are_refused(field, value):
    # subword_nbest=600 and subword_alpha=Infinity were accepted, then failed after the
    # vocabulary and the data report (SentencePiece's nbest limit is 512).
    from keras_transformer.text import subword_sampling
    from keras_transformer.training import presets

    with pytest.raises(ValueError, match=rf"`{field}` must be"):
        get_preset("tiny").replace(**{field: value})
    assert presets.MAX_NBEST == subword_sampling.MAX_NBEST


def test_numpy_numbers_become_python_numbers():
    import numpy as np

    config = get_preset("tiny").replace(batch_size=np.int64(32), lr_scale=np.float32(0.5),
                                        bucket_boundaries=[np.int64(8), 16])
    assert type(config.batch_size) is int and type(config.lr_scale) is float
    json.dumps(config.to_dict())
    # A float32 keeps the number it was written as: 0.1, not 0.10000000149011612, which a
    # later run given a plain 0.1 was refused as a different configuration.
    assert get_preset("tiny").replace(dropout=np.float32(0.1)).dropout == 0.1


@pytest.mark.parametrize("field, value", [
    ("batch_size", 0), ("tokens_per_batch", 0), ("warmup_steps", 0), ("epochs", 0),
    ("steps_per_epoch", 0), ("train_subset", 0), ("num_heads", 0), ("d_model", 0),
    ("ff_dim", -1), ("num_layers", 0), ("num_decoder_layers", 0), ("beam_size", 0),
    ("bleu_every_n_epochs", 0), ("tokenizer_sample_pairs", 0), ("vocab_size", 3),
    ("max_length", 1), ("lr_scale", -1.0), ("global_clipnorm", -1.0), ("clipnorm", 0.0),
    ("bleu_sentences", -1), ("length_penalty", float("nan")),
])
def test_values_out_of_range_are_refused_naming_the_field(field, value):
    # batch_size=0 trained with 64, tokens_per_batch=0 with batches of one, warmup_steps=0
    # failed after the vocabulary was written (and the run directory then refused the fix).
    overrides = {field: value}
    if field == "tokens_per_batch":
        overrides["batch_size"] = None
    with pytest.raises(ValueError, match=rf"out of range: {field}="):
        get_preset("tiny").replace(**overrides)


def test_late_dropout_is_switched_off_with_its_epochs_left_as_they_are():
    # `--set late_dropout=null` on the reference preset (which sets its epochs) stays valid.
    assert get_preset("multi30k").replace(late_dropout=None).late_dropout_after == 12


def test_attention_dropout_reaches_the_attention_layers_alone():
    from keras_transformer.layers import MultiHeadAttention
    from keras_transformer.training.trainer import build_model

    class Sized:
        vocab_size = 300

    tokenizer = Sized()
    rates = {}
    for setting in (None, 0.0):
        model = build_model(get_preset("tiny").replace(dropout=0.2, attention_dropout=setting),
                            tokenizer, tokenizer)
        layers = list(model._flatten_layers())
        rates[setting] = ({layer.dropout for layer in layers
                           if isinstance(layer, MultiHeadAttention)},
                          model.get_layer("encoder").dropout)
    assert rates == {None: ({0.2}, 0.2), 0.0: ({0.0}, 0.2)}
    with pytest.raises(ValueError, match="attention_dropout"):
        get_preset("tiny").replace(attention_dropout=1.0)
