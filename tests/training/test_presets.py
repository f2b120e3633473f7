"""TrainingConfig: documented fields, presets, validation, files and overrides."""

import dataclasses
import json

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
    with pytest.raises(ValueError, match="precision"):
        config.replace(precision="float16")
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
