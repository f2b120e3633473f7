"""Child script of the sharding test: the examples one worker of a cluster sees in an epoch.

Usage: `python shard_child.py RUN_DIR TFDS_DIR RESULT_JSON [SUBWORD_NBEST]` with
`TF_CONFIG` set (or not: then it lists the whole epoch of one process).

Builds the trainer's real training pipeline (tiny preset, the run's tokenizer, one
shuffled epoch; with SUBWORD_NBEST > 1 each sentence in a segmentation drawn among its
SUBWORD_NBEST best, as `subword_nbest` trains), distributes it under the strategy
`TF_CONFIG` selects and writes every example this worker received as `[encoder ids,
decoder ids]` without padding; without `TF_CONFIG` also, under "best", the epoch's examples
in the tokenizer's own segmentation.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from keras_transformer.training.strategy import select_strategy  # noqa: E402

# The strategy first: MultiWorkerMirroredStrategy must configure TensorFlow at start.
STRATEGY = select_strategy("auto")

from keras_transformer.data import load_multi30k  # noqa: E402
from keras_transformer.text import load_tokenizers  # noqa: E402
from keras_transformer.training import get_preset  # noqa: E402
from keras_transformer.training.strategy import shard_by_data  # noqa: E402
from keras_transformer.training.trainer import (  # noqa: E402
    make_epoch_train_dataset, segmentation_samplers)

# Training pairs of the epoch: 10 global batches of 8.
TRAIN_SUBSET = 80


def _examples(batches):
    return [[[int(t) for t in source if t], [int(t) for t in target if t]]
            for encoder, decoder in batches for source, target in zip(encoder, decoder)]


def main():
    run_dir, tfds_dir, result = sys.argv[1:4]
    nbest = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    config = get_preset("tiny").replace(train_subset=TRAIN_SUBSET, steps_per_epoch=None,
                                        epochs=1, subword_nbest=nbest, subword_alpha=0.2)
    source_tokenizer, target_tokenizer = load_tokenizers(os.path.join(run_dir, "tokenizer"))
    pairs = load_multi30k("train", data_dir=tfds_dir).take(TRAIN_SUBSET)
    samplers = segmentation_samplers(config, pairs, source_tokenizer, target_tokenizer,
                                     log=None)
    dataset, steps = make_epoch_train_dataset(
        config, pairs, source_tokenizer, target_tokenizer, STRATEGY.num_replicas_in_sync,
        samplers=samplers)
    batches = []
    for inputs, _ in STRATEGY.experimental_distribute_dataset(shard_by_data(dataset)):
        batches.extend(zip(
            [t.numpy() for t in STRATEGY.experimental_local_results(inputs["encoder_tokens"])],
            [t.numpy() for t in STRATEGY.experimental_local_results(inputs["decoder_tokens"])]))
    output = {"steps": steps, "examples": _examples(batches)}
    if "TF_CONFIG" not in os.environ:  # the whole epoch: compared with the best segmentations
        best, _ = make_epoch_train_dataset(config, pairs, source_tokenizer, target_tokenizer)
        output["best"] = _examples((inputs["encoder_tokens"].numpy(),
                                    inputs["decoder_tokens"].numpy()) for inputs, _ in best)
    with open(result, "w", encoding="utf-8") as f:
        json.dump(output, f)


if __name__ == "__main__":
    main()
