"""Child script of the sharding test: the examples one worker of a cluster sees in an epoch.

Usage: `python shard_child.py RUN_DIR TFDS_DIR RESULT_JSON` with `TF_CONFIG` set (or not:
then it lists the whole epoch of one process).

Builds the trainer's real training pipeline (tiny preset, the run's tokenizer, one
shuffled epoch), distributes it under the strategy `TF_CONFIG` selects and writes every
example this worker received as `[encoder ids, decoder ids]` without padding.
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
from keras_transformer.training.trainer import make_epoch_train_dataset  # noqa: E402

# Training pairs of the epoch: 10 global batches of 8.
TRAIN_SUBSET = 80


def main():
    run_dir, tfds_dir, result = sys.argv[1:4]
    config = get_preset("tiny").replace(train_subset=TRAIN_SUBSET, steps_per_epoch=None,
                                        epochs=1)
    source_tokenizer, target_tokenizer = load_tokenizers(os.path.join(run_dir, "tokenizer"))
    pairs = load_multi30k("train", data_dir=tfds_dir).take(TRAIN_SUBSET)
    dataset, steps = make_epoch_train_dataset(
        config, pairs, source_tokenizer, target_tokenizer, STRATEGY.num_replicas_in_sync)
    examples = []
    for inputs, _ in STRATEGY.experimental_distribute_dataset(shard_by_data(dataset)):
        encoder = STRATEGY.experimental_local_results(inputs["encoder_tokens"])
        decoder = STRATEGY.experimental_local_results(inputs["decoder_tokens"])
        for encoder_batch, decoder_batch in zip(encoder, decoder):
            for source, target in zip(encoder_batch.numpy(), decoder_batch.numpy()):
                examples.append([[int(t) for t in source if t], [int(t) for t in target if t]])
    with open(result, "w", encoding="utf-8") as f:
        json.dump({"steps": steps, "examples": examples}, f)


if __name__ == "__main__":
    main()
