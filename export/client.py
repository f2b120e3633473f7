#!/usr/bin/env python3
"""Calls the `translator` model of a TF Serving model server and prints the translations.

REST (default) needs only the Python standard library:

    python export/client.py "A dog runs." "Two men are talking."
    cat sentences.en | python export/client.py --server http://localhost:8501 > out.de

It sends `POST <server>/v1/models/<model>:predict` with
`{"signature_name": "translate", "instances": ["A dog runs.", ...]}` (the row format; the
signature has one named string input, `text`, so each instance is the plain string) and reads
`{"predictions": [{"translation": ..., "score": ..., "length": ..., "truncated": ...,
"unfinished": ...}, ...]}` (`truncated`: the source was cut to the model's
`max_input_length`; `unfinished`: the translation reached its length limit before its end;
the count and line numbers of such sentences are said on stderr at the end).

gRPC (`--grpc`, port 8500) needs `pip install tensorflow-serving-api` (which brings
`tensorflow` and `grpcio`); it sends a `PredictRequest` with the `text` input as a string
tensor.

Sentences come from the arguments, or one per line from standard input when none is given.
Requests carry length-sorted batches (`translate_all`), so the server pads little (when
standard input pauses for 0.2 s, what it gave is sent at once, on POSIX systems: lines
typed, or written one at a time by another program, are translated as they come); each
translation is printed on its own line, in input order (with `--json`, one JSON object per
line with `translation`, `score`, `length`, `truncated` and `unfinished`). A request the
server cannot take now (its batching queue full: UNAVAILABLE, HTTP 503; RESOURCE_EXHAUSTED,
HTTP 429; or no connection, a server restarting) is sent again after 0.5 s, 1 s, 2 s, ...
up to `--retries` times (3 by default), each retry said on stderr; one of more sentences
than the server's `max_batch_size` is sent again in requests of that size. Exit status 1
with the server's error message when a request fails for good, or with what is wrong with
the input (UTF-16 text, lines ended by a carriage return alone) before anything is sent; 130 after Ctrl-C (saying how
many translations were printed), 141 when the output's reader went away (`| head`).
"""

import argparse
import contextlib
import http.client
import json
import os
import re
import select
import socket
import sys
import time
import urllib.error
import urllib.request

DEFAULT_REST_SERVER = "http://localhost:8501"
DEFAULT_GRPC_SERVER = "localhost:8500"
DEFAULT_MODEL = "translator"
DEFAULT_SIGNATURE = "translate"
INPUT_NAME = "text"
OUTPUT_NAMES = ("translation", "score", "length")


# Requests read ahead and sorted by length together, as `keras-transformer translate` does
# (CTranslate2's read buffer, Marian's maxi-batch): similar lengths share a request, so the
# server's batch pads little; output still comes in input order, a buffer at a time.
SORT_BUFFER_BATCHES = 16
# Yielded by `stdin_lines` when no more input has come for `IDLE_SECONDS`: `translate_all`
# sends what it has read instead of waiting for a full read-ahead buffer (a user typing, or
# a program writing one line and waiting for its translation).
IDLE = object()
IDLE_SECONDS = 0.2


# HTTP statuses TF Serving gives errors worth sending again: UNAVAILABLE (its batching queue
# is full, or the model is loading) and RESOURCE_EXHAUSTED.
RETRYABLE_HTTP_STATUSES = (429, 503)
RETRYABLE_GRPC_CODES = ("UNAVAILABLE", "RESOURCE_EXHAUSTED")
FIRST_RETRY_PAUSE = 0.5  # seconds, doubled at every retry
# TF Serving's answer to a request of more sentences than its max_batch_size (the batching
# library's message, in TensorFlow's batch_resource_base; INVALID_ARGUMENT, HTTP 400).
_TOO_LARGE = re.compile(r"Task size \d+ is larger than maximum input batch size (\d+)")


class ServerError(RuntimeError):
    """The model server answered with an error (or did not answer).

    `retryable` says whether the same request may succeed later (a full queue, a server
    restarting), as opposed to a request it will always refuse.
    """

    def __init__(self, message, retryable=False):
        super().__init__(message)
        self.retryable = retryable
        # The server's max_batch_size when it refused a request for having more sentences.
        too_large = _TOO_LARGE.search(message)
        self.max_batch_size = int(too_large.group(1)) if too_large else None


def _rest_base(server):
    server = server.rstrip("/")
    return server if "://" in server else f"http://{server}"


def predict_rest(sentences, server=DEFAULT_REST_SERVER, model=DEFAULT_MODEL,
                 signature=DEFAULT_SIGNATURE, timeout=60.0):
    """Translates `sentences` (list of str) through TF Serving's REST `:predict` API.

    Returns:
        list of dicts `{"translation": str, "score": float, "length": int, "truncated": bool,
        "unfinished": bool}`, one per sentence.

    Raises:
        ServerError: on an HTTP error (with the server's `error` message) or no connection.
    """
    url = f"{_rest_base(server)}/v1/models/{model}:predict"
    sentences = list(sentences)
    body = json.dumps({"signature_name": signature, "instances": sentences}).encode()
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            text = response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as error:
        detail = error.read().decode("utf-8", errors="replace")
        try:
            document = json.loads(detail)
        except ValueError:
            document = None
        if isinstance(document, dict) and "error" in document:
            detail = document["error"]
        raise ServerError(f"{url} answered HTTP {error.code}: {detail}",
                          retryable=error.code in RETRYABLE_HTTP_STATUSES) from error
    except (urllib.error.URLError, OSError) as error:
        # Refused or reset (a server restarting) is worth a retry; a timeout is not (the
        # same slow batch again, adding to the server's load).
        # `socket.timeout` is `TimeoutError` from Python 3.10 on; before, its own class.
        if isinstance(getattr(error, "reason", error), (TimeoutError, socket.timeout)):
            raise ServerError(f"{url} did not answer within --timeout {timeout:g} seconds",
                              retryable=False) from error
        raise ServerError(f"Cannot reach {url}: {error}", retryable=True) from error
    except http.client.HTTPException as error:
        # A reply cut short (a connection closed mid-body), or not HTTP/1 (the gRPC port).
        raise ServerError(f"{url} answered with a broken HTTP reply ({type(error).__name__}: "
                          f"{error}); is it TF Serving's REST port?",
                          retryable=isinstance(error, http.client.IncompleteRead)) from error
    # A proxy's page or a server of another kind: said in one line, not a traceback.
    try:
        document = json.loads(text)
    except ValueError:
        raise ServerError(
            f"{url} answered with a body that is not JSON: {text[:200]!r}") from None
    predictions = document.get("predictions") if isinstance(document, dict) else None
    if not isinstance(predictions, list):
        raise ServerError(f"{url} answered without 'predictions': {text[:200]}")
    if len(predictions) != len(sentences):
        raise ServerError(f"{url} answered {len(predictions)} prediction(s) for "
                          f"{len(sentences)} sentences")
    results = []
    for prediction in predictions:
        if not isinstance(prediction, dict):  # a single-output signature: plain values
            prediction = {"translation": prediction}
        if "translation" not in prediction:
            raise ServerError(f"{url} answered a prediction with no 'translation': "
                              f"{str(prediction)[:200]} (is --signature a translate one?)")
        try:
            translation = prediction["translation"]
            if not isinstance(translation, str):
                raise TypeError(f"a translation of type {type(translation).__name__}")
            results.append({
                "translation": translation,
                "score": float(prediction.get("score", float("nan"))),
                "length": int(prediction.get("length", -1)),
                "truncated": bool(prediction.get("truncated", False)),
                "unfinished": bool(prediction.get("unfinished", False)),
            })
        except (TypeError, ValueError) as error:  # a null or text score, say
            raise ServerError(f"{url} answered a prediction with a field of the wrong type "
                              f"({error}): {str(prediction)[:200]}") from None
    return results


def predict_grpc(sentences, server=DEFAULT_GRPC_SERVER, model=DEFAULT_MODEL,
                 signature=DEFAULT_SIGNATURE, timeout=60.0):
    """Translates `sentences` through TF Serving's gRPC `PredictionService/Predict`.

    Needs `tensorflow-serving-api` (and the `tensorflow` and `grpcio` it depends on).
    """
    try:
        import grpc
        import tensorflow as tf
        from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
    except ImportError as error:
        raise SystemExit(
            f"--grpc needs `pip install tensorflow-serving-api` ({error}); or use REST."
        ) from error
    if "://" in server:
        server = server.split("://", 1)[1]
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    request.inputs[INPUT_NAME].CopyFrom(
        tf.make_tensor_proto([s.encode("utf-8") for s in sentences], dtype=tf.string,
                             shape=[len(sentences)])
    )
    with grpc.insecure_channel(server) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        try:
            response = stub.Predict(request, timeout=timeout)
        except grpc.RpcError as error:
            raise ServerError(f"{server} answered {error.code()}: {error.details()}",
                              retryable=error.code().name in RETRYABLE_GRPC_CODES) from error
    outputs = {name: tf.make_ndarray(response.outputs[name]).tolist() for name in OUTPUT_NAMES}
    # Exports from before the flags have no `truncated` or `unfinished` output.
    flags = {name: (tf.make_ndarray(response.outputs[name]).tolist()
                    if name in response.outputs else [False] * len(sentences))
             for name in ("truncated", "unfinished")}
    return [
        {"translation": t.decode("utf-8", errors="replace"), "score": float(s), "length": int(n),
         "truncated": bool(c), "unfinished": bool(u)}
        for t, s, n, c, u in zip(*(outputs[name] for name in OUTPUT_NAMES), flags["truncated"],
                                 flags["unfinished"])
    ]


def predict_with_retries(predict, batch, retries=3, sleep=time.sleep, **predict_kwargs):
    """`predict(batch, **predict_kwargs)`, sent again after a retryable `ServerError`.

    Waits `FIRST_RETRY_PAUSE` seconds before the first retry, twice as long before each next
    one, at most `retries` retries; says each on stderr. The last error is raised.
    """
    pause = FIRST_RETRY_PAUSE
    for attempt in range(retries + 1):
        try:
            return predict(batch, **predict_kwargs)
        except ServerError as error:
            if not error.retryable or attempt == retries:
                raise
            print(f"{error}; retrying in {pause:g} s ({attempt + 1} of {retries})",
                  file=sys.stderr, flush=True)
            sleep(pause)
            pause *= 2


def translate_all(sentences, predict, batch_size=64, sort_buffer_batches=SORT_BUFFER_BATCHES,
                  retries=0, sleep=time.sleep, **predict_kwargs):
    """Translates an iterable of sentences in length-sorted requests, yielding in input order.

    Reads `batch_size * sort_buffer_batches` sentences, sorts them by UTF-8 length, sends
    them `batch_size` per request through `predict(batch, **predict_kwargs)` (with up to
    `retries` retries: `predict_with_retries`), and yields the buffer's results in the
    original order before reading the next buffer; an `IDLE` item (the input paused, see
    `stdin_lines`) sends the sentences read so far at once. A request the server refuses for having
    more sentences than its `max_batch_size` is sent again in requests of that size, as are
    all later ones (said once on stderr).

    Args:
        sentences: iterable of str.
        predict: `predict_rest` or `predict_grpc` (or any callable with their signature).
        batch_size: int, sentences per request. Defaults to `64`.
        sort_buffer_batches: int, requests read ahead and sorted together; `1` keeps the
            input order. Defaults to `SORT_BUFFER_BATCHES`.
        retries: int, retries of a request the server could not take now. Defaults to `0`.
        sleep: callable taking seconds, how to wait before a retry. Defaults to `time.sleep`.
        **predict_kwargs: passed to `predict` (server, model, signature, timeout).

    Yields:
        dicts `{"translation", "score", "length", "truncated", "unfinished"}`, one per
        sentence, in input order.
    """
    batch_size = max(int(batch_size), 1)
    iterator = iter(sentences)
    while True:
        buffer = []
        for sentence in iterator:
            if sentence is IDLE:  # the input paused: send what it gave
                if buffer:
                    break
                continue
            buffer.append(sentence)
            if len(buffer) == batch_size * sort_buffer_batches:
                break
        if not buffer:
            return
        order = sorted(range(len(buffer)), key=lambda i: len(buffer[i].encode("utf-8")))
        results = [None] * len(buffer)
        start = 0
        while start < len(order):
            indices = order[start:start + batch_size]
            try:
                answers = predict_with_retries(predict, [buffer[i] for i in indices], retries,
                                               sleep, **predict_kwargs)
            except ServerError as error:
                if error.max_batch_size is None or not 0 < error.max_batch_size < len(indices):
                    raise
                batch_size = error.max_batch_size
                print(f"The server takes at most {batch_size} sentences a request (its "
                      f"max_batch_size): sending {batch_size} at a time (--batch-size "
                      f"{batch_size} avoids the refused request).", file=sys.stderr,
                      flush=True)
                continue
            for index, answer in zip(indices, answers):
                results[index] = answer
            start += len(indices)
        yield from results


class InputError(ValueError):
    """Input the client refuses to send (as `keras-transformer translate` refuses it)."""


def _check_first_line(line, whole):
    """Refuses UTF-16 text (a byte order mark, or NULs for a quarter of the bytes: every
    sentence would be sent garbled) and lines ended by a carriage return alone (classic Mac
    OS: the whole input would be one sentence)."""
    nuls = line.count(b"\x00")
    if line.startswith((b"\xff\xfe", b"\xfe\xff")) or (nuls and nuls * 4 >= len(line)):
        raise InputError("the input looks like UTF-16, not UTF-8: convert it (e.g. `iconv -f "
                         "utf-16 -t utf-8`).")
    if whole and line.count(b"\r") - line.count(b"\r\n") >= 2:
        raise InputError("the input's lines end in a carriage return alone (classic Mac OS), "
                         "so it reads as one line: convert it (tr '\\r' '\\n').")


def _line_text(line, first, whole=False):
    """A line's text; `first`: the input's first line, checked (`_check_first_line`) when
    it is the `whole` input (no `\\n` in it: classic Mac OS line ends, or one line)."""
    if first:
        _check_first_line(line, whole)
    if first and line.startswith(b"\xef\xbb\xbf"):  # a byte order mark
        line = line[3:]
    if line.endswith(b"\r"):
        line = line[:-1]
    return line.decode("utf-8", errors="replace")


def stdin_lines(stream, idle_seconds=IDLE_SECONDS):
    """The lines of a binary stream, one at a time, without "\n" or "\r\n"; invalid UTF-8
    replaced. Only "\n" ends a line (Unicode separators stay inside their sentence).

    Read from its file descriptor where it has one (POSIX): when no input comes for
    `idle_seconds`, `IDLE` is yielded once, so lines typed or written one at a time are
    translated as they come. Other streams are read line by line.
    """
    try:
        descriptor = stream.fileno()
    except (AttributeError, OSError, ValueError):
        descriptor = None
    if descriptor is None or os.name != "posix":
        for number, line in enumerate(stream):
            ended = line.endswith(b"\n")
            yield _line_text(line[:-1] if ended else line, number == 0, whole=not ended)
        return
    pending, number, idle = [], 0, False  # the unfinished line's chunks, joined once
    while True:
        if not idle and not select.select([descriptor], [], [], idle_seconds)[0]:
            idle = True
            yield IDLE
            continue
        chunk = os.read(descriptor, 1 << 16)
        idle = False
        if not chunk:
            break
        first, *lines = chunk.split(b"\n")
        pending.append(first)
        if not lines:  # a line longer than one read
            continue
        lines[:0] = [b"".join(pending)]
        pending = [lines.pop()]
        for line in lines:
            yield _line_text(line, number == 0)
            number += 1
    if any(pending):
        yield _line_text(b"".join(pending), number == 0, whole=number == 0)


def _positive(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _seconds(text):
    value = float(text)
    if not 0 < value < float("inf"):  # NaN too
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text}")
    return value


def _non_negative(text):
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Translate sentences with a TF Serving `translator` model.")
    parser.add_argument("sentences", nargs="*",
                        help="sentences to translate; read from stdin (one a line) if none")
    parser.add_argument("--server", default=None,
                        help=f"REST base URL (default {DEFAULT_REST_SERVER}) or, with --grpc, "
                             f"host:port (default {DEFAULT_GRPC_SERVER})")
    parser.add_argument("--model", default=DEFAULT_MODEL, help="model name (default %(default)s)")
    parser.add_argument("--signature", default=DEFAULT_SIGNATURE,
                        help="signature: translate, translate_greedy or serving_default "
                             "(default %(default)s)")
    parser.add_argument("--grpc", action="store_true", help="use gRPC instead of REST")
    parser.add_argument("--batch-size", type=_positive, default=64,
                        help="sentences per request (default %(default)s, the server's "
                             "max_batch_size in export/batching_parameters.txt; a request "
                             "the server refuses as larger is sent in requests of its size)")
    parser.add_argument("--timeout", type=_seconds, default=60.0,
                        help="seconds per request (default %(default)s)")
    parser.add_argument("--retries", type=_non_negative, default=3,
                        help="retries of a request the server cannot take now (queue full, "
                             "HTTP 503/429, no connection), after 0.5 s, 1 s, 2 s, ... "
                             "(default %(default)s)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per line with translation, score, length, "
                        "truncated, unfinished")
    return parser.parse_args(argv)


def main(argv=None):
    args = _parse_args(argv)
    # Undecodable bytes of an argument arrive as surrogates: replaced, as stdin's are.
    sentences = [s.encode("utf-8", "surrogateescape").decode("utf-8", errors="replace")
                 for s in args.sentences]
    if not sentences:
        sentences = stdin_lines(sys.stdin.buffer)  # read as it is translated
    # UTF-8 output whatever the locale (a C locale would fail on the first umlaut).
    sys.stdout.reconfigure(encoding="utf-8")
    predict = predict_grpc if args.grpc else predict_rest
    server = args.server or (DEFAULT_GRPC_SERVER if args.grpc else DEFAULT_REST_SERVER)
    lines, cut, unfinished = 0, [], []
    try:
        for result in translate_all(sentences, predict, batch_size=args.batch_size,
                                    retries=args.retries, server=server, model=args.model,
                                    signature=args.signature, timeout=args.timeout):
            if args.json:
                print(json.dumps(result, ensure_ascii=False))
            else:
                # One line per input line: a line break the model emitted would move
                # every later line.
                print(" ".join(filter(None, re.split(r"[\r\n]+", result["translation"]))))
            sys.stdout.flush()
            lines += 1  # printed
            if result.get("truncated"):
                cut.append(lines)
            if result.get("unfinished"):
                unfinished.append(lines)
    except (ServerError, InputError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        of = f" of {len(sentences)}" if isinstance(sentences, list) else ""
        print(f"\nInterrupted: the first {lines}{of} translations were printed.",
              file=sys.stderr, flush=True)
        return 130
    except BrokenPipeError:  # the reader went away (`| head`): nothing more to say
        with contextlib.suppress(OSError, ValueError):  # no flush error at exit either
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    for numbers, what in ((cut, "sentences were longer than the model's max_input_length and "
                                "were cut before translating"),
                          (unfinished, "translations reached the model's output length limit "
                                       "before their end and are cut short")):
        if numbers:
            shown = ", ".join(map(str, numbers[:20])) + (", ..." if len(numbers) > 20 else "")
            print(f"{len(numbers)} of {lines} {what}: {shown}.", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
