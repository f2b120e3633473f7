"""Fixtures of the training tests."""

import pytest


@pytest.fixture(scope="session")
def multi30k_tfds_dir(tmp_path_factory):
    """A TFDS data directory with Multi30K prepared once for the whole session."""
    from keras_transformer.data import load_multi30k

    directory = tmp_path_factory.mktemp("tfds")
    load_multi30k("validation", data_dir=directory)
    return directory
