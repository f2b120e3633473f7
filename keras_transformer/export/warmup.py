"""TF Serving's warm-up file: requests the server replays when it loads a version.

TF Serving reads `assets.extra/tf_serving_warmup_requests` (a TFRecord file of
`tensorflow.serving.PredictionLog` protos) and runs every request before the version takes
traffic, so the first users do not pay for graph optimization. The signatures a `--jit`
export compiles get none (`Translator.compiled_signatures`; with greedy or beam search that
is all of them, so no file): on a server without `--xla_cpu_compilation_enabled=true` their
small batches fail, and a failed warm-up request makes TF Serving refuse to load the version.
The protos are written here by hand (protobuf's wire format: a handful of length-delimited
fields), so exporting needs no `tensorflow-serving-api`; the tests parse the file with that
package's own classes.
"""

import numpy as np
import tensorflow as tf

# The file's name and place, as TF Serving looks for it.
WARMUP_FILENAME = "tf_serving_warmup_requests"
# Requests replayed for each signature that takes text (a sampling export's
# `translate_seeded` with seed 0 for each sentence): one short sentence (a user's single
# request) and one longer. One sentence a request: TF Serving refuses a version whose warm-up
# request fails, as a batch above a server's `max_batch_size` would.
WARMUP_BATCHES = (
    ("A warm-up request.",),
    ("A longer warm-up request, of about twenty words, so that the server also runs a wider "
     "batch of pieces before it takes traffic.",),
)


def _varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number, payload):
    """A length-delimited protobuf field (wire type 2): a message, a string or bytes."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def prediction_log(signature_name, inputs):
    """A serialized `tensorflow.serving.PredictionLog` holding one `PredictRequest`.

    Args:
        signature_name: str, the signature the request calls.
        inputs: dict of input name to array-like (strings for `text`; a `numpy` array keeps
            its dtype, e.g. int64 seeds).

    Returns:
        bytes, the serialized proto.
    """
    spec = _field(3, signature_name.encode("utf-8"))  # ModelSpec.signature_name
    request = _field(1, spec)  # PredictRequest.model_spec
    for name, value in sorted(inputs.items()):  # PredictRequest.inputs, a map
        array = value if isinstance(value, np.ndarray) else np.asarray(value, dtype=object)
        tensor = tf.make_tensor_proto(array).SerializeToString()
        request += _field(2, _field(1, name.encode("utf-8")) + _field(2, tensor))
    return _field(6, _field(1, request))  # PredictionLog.predict_log.request


# Inputs a warm-up request may carry besides `text`: one value per sentence.
_PER_SENTENCE_INPUTS = {"seed": np.int64}


def _input_names(function):
    return [getattr(spec, "name", None)
            for spec in tf.nest.flatten(function.structured_input_signature)]


def text_signatures(signatures):
    """The names of `signatures` (name -> concrete function) whose inputs are `text` and,
    optionally, per-sentence inputs the warm-up can fill (`seed`, of `translate_seeded`)."""
    names = []
    for name, function in signatures.items():
        inputs = set(_input_names(function))
        if "text" in inputs and inputs - {"text"} <= set(_PER_SENTENCE_INPUTS):
            names.append(name)
    return sorted(names)


def _request_inputs(signature_inputs, batch):
    inputs = {"text": list(batch)}
    for name in signature_inputs:
        if name in _PER_SENTENCE_INPUTS:
            inputs[name] = np.zeros(len(batch), _PER_SENTENCE_INPUTS[name])
    return inputs


def write_warmup_requests(path, signatures, batches=WARMUP_BATCHES):
    """Writes the warm-up file: every batch of `batches` for every signature of
    `signatures` that takes text (`text_signatures`), with zeros for its per-sentence
    inputs (`seed`).

    Args:
        path: str or path-like, the file (`assets.extra/tf_serving_warmup_requests`).
        signatures: dict of name -> concrete function, the signatures to warm up.
        batches: sequence of sequences of str, the sentences of each request.

    Returns:
        int, the number of requests written.
    """
    count = 0
    with tf.io.TFRecordWriter(str(path)) as writer:
        for name in text_signatures(signatures):
            inputs = _input_names(signatures[name])
            for batch in batches:
                writer.write(prediction_log(name, _request_inputs(inputs, batch)))
                count += 1
    return count
