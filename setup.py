"""Packaging for keras-transformer."""

from setuptools import find_packages, setup

setup(
    name="keras-transformer",
    version="0.1.0",
    description=(
        "The encoder-decoder Transformer (Vaswani et al., 2017) as Keras 3 layers, "
        "trained with model.fit and exported as a string-to-string SavedModel."
    ),
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["keras_transformer", "keras_transformer.*"]),
    # Multi30K's sizes and SHA-256s, which every download is checked against.
    package_data={"keras_transformer.data": ["checksums.tsv"]},
    python_requires=">=3.10",
    install_requires=[
        "tensorflow~=2.21.0",
        "tensorflow-text~=2.21.0",
        "keras>=3.15,<4",
        "tensorflow-datasets>=4.9,<5",
        # TFDS 4.9.10 imports it to prepare any dataset but declares it for Python < 3.9
        # only (tensorflow/datasets#11212): without it every `--data tfds:NAME` failed.
        "importlib_resources",
        "sentencepiece>=0.2,<1",
        "sacrebleu>=2.4,<3",
        "tensorboard~=2.21.0",
        "pyyaml>=6",
        "numpy>=1.26",
    ],
    extras_require={
        # keras-hub is the tests' numerical oracle and the training benchmark's peer; the
        # package itself never imports it.
        "test": ["keras-hub>=0.32,<1"],
        # The benchmarks' peers: keras-hub (train_vs_keras_hub.py) and CTranslate2, the
        # speed peer and correctness oracle of decode_vs_ctranslate2.py.
        "bench": ["keras-hub>=0.32,<1", "ctranslate2>=4.5,<5"],
        "dev": [
            "keras-hub>=0.32,<1",
            "pytest>=8",
            "pytest-timeout>=2.3",
            "pytest-xdist>=3.5",
            "nbmake>=1.5",
            "nbclient>=0.10",
            "nbformat>=5.10",
            "ipykernel>=6",
            "matplotlib>=3.8",
            "requests>=2.31",
            "tensorflow-serving-api~=2.21.0",
            "ctranslate2>=4.5,<5",
        ],
        "serving": ["requests>=2.31"],
        # `keras-transformer export-ctranslate2` and its models in translate/evaluate.
        "ctranslate2": ["ctranslate2>=4.5,<5"],
    },
    entry_points={
        "console_scripts": ["keras-transformer=keras_transformer.cli:main"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
