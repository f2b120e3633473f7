"""Text: reserved ids, normalization, SentencePiece training and the in-graph tokenizer.

Modules: `special_tokens` (reserved ids), `normalization` (`normalize`),
`sentencepiece_trainer` (`train_sentencepiece`), `subword_tokenizer` (`SubwordTokenizer`),
`tokenizers` (`train_tokenizers`, `load_tokenizers`).
"""

from keras_transformer.text.normalization import NORMALIZATION_RULE, normalize
from keras_transformer.text.sentencepiece_trainer import train_sentencepiece
from keras_transformer.text.special_tokens import END_ID, PAD_ID, START_ID, UNK_ID
from keras_transformer.text.subword_tokenizer import MODEL_FILENAME, SubwordTokenizer
from keras_transformer.text.tokenizers import load_tokenizers, train_tokenizers

__all__ = [
    "END_ID",
    "MODEL_FILENAME",
    "NORMALIZATION_RULE",
    "PAD_ID",
    "START_ID",
    "SubwordTokenizer",
    "UNK_ID",
    "load_tokenizers",
    "normalize",
    "train_sentencepiece",
    "train_tokenizers",
]
