"""`export/client.py` end to end over loopback HTTP against a stub of TF Serving's REST API."""

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import urllib.request

import numpy as np
import pytest

from keras_transformer.export import ExportedTranslator
from tests.export.closed_pipe import ClosedPipe
from tests.export.stub_server import StubModelServer

CLIENT = pathlib.Path(__file__).resolve().parents[2] / "export" / "client.py"
SENTENCES = ["ka lo mi", "bal dor fen gim", "", "Grüße aus Köln 🐕", "tu vo xe sel"]


def run_client(*args, stdin=None):
    env = dict(os.environ, PYTHONIOENCODING="ascii", LC_ALL="C")  # the client must not care
    return subprocess.run(
        [sys.executable, str(CLIENT), *args], input=stdin, capture_output=True, timeout=60,
        env=env,
    )


@pytest.fixture(scope="module")
def server(exported):
    with StubModelServer(exported / "1", lifetime=600) as stub:
        yield stub


@pytest.mark.slow
# The module's first test: its time counts building the session's exported model when
# this file is the first of tests/export/ its pytest-xdist worker runs (~30 s alone).
@pytest.mark.timeout(300)
@pytest.mark.parametrize("signature", ["translate", "serving_default", "translate_greedy"])
def test_client_translations_equal_the_saved_model(server, exported, signature):
    expected = ExportedTranslator(exported, signature=signature).translate(SENTENCES)
    completed = run_client("--server", server.url, "--signature", signature, "--json",
                           *SENTENCES)
    assert completed.returncode == 0, completed.stderr.decode()
    results = [json.loads(line) for line in completed.stdout.decode("utf-8").splitlines()]
    assert [r["translation"] for r in results] == [e["translation"] for e in expected]
    assert [r["length"] for r in results] == [e["length"] for e in expected]
    np.testing.assert_allclose([r["score"] for r in results], [e["score"] for e in expected],
                               rtol=1e-5)
    assert "POST /v1/models/translator:predict HTTP/1.1" in server.requests[-1]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_client_reads_stdin_and_batches(server, exported):
    expected = ExportedTranslator(exported)(SENTENCES)
    before = len(server.requests)
    stdin = ("\n".join(SENTENCES) + "\n").encode("utf-8")
    completed = run_client("--server", server.url.replace("http://", ""), "--batch-size", "2",
                           stdin=stdin)
    assert completed.returncode == 0, completed.stderr.decode()
    assert completed.stdout.decode("utf-8").split("\n")[:-1] == expected
    assert len(server.requests) - before == 3  # 5 sentences in batches of 2


@pytest.mark.slow
def test_stub_speaks_the_tf_serving_formats(server):
    """The row and columnar formats and the error document, as TF Serving answers them."""
    url = f"{server.url}/v1/models/translator:predict"

    def post(document):
        request = urllib.request.Request(url, json.dumps(document).encode(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    status, rows = post({"signature_name": "translate", "instances": ["ka lo"]})
    assert status == 200 and set(rows["predictions"][0]) == {"translation", "score", "length",
                                                                "truncated", "unfinished"}
    status, columns = post({"signature_name": "translate", "inputs": {"text": ["ka lo"]}})
    assert status == 200
    assert columns["outputs"]["translation"] == [rows["predictions"][0]["translation"]]
    status, error = post({"signature_name": "nope", "instances": ["ka"]})
    assert status == 400 and "nope" in error["error"]
    # A scalar is one string, refused by the graph's shape check (the stub had iterated it:
    # 5 results for "ka lo", one per character).
    status, error = post({"signature_name": "translate", "inputs": "ka lo"})
    assert status == 400 and "compatible with expected shape" in error["error"]


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_client_reports_server_errors(server):
    completed = run_client("--server", server.url, "--signature", "nope", "ka")
    assert completed.returncode == 1
    assert b"HTTP 400" in completed.stderr and b"nope" in completed.stderr
    completed = run_client("--server", server.url, "--model", "other", "ka")
    assert completed.returncode == 1 and b"HTTP 404" in completed.stderr


@pytest.mark.timeout(60)
def test_client_reports_an_unreachable_server():
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    completed = run_client("--server", f"http://127.0.0.1:{port}", "ka")
    assert completed.returncode == 1 and b"Cannot reach" in completed.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_grpc_client_against_a_stub_prediction_service(exported):
    pytest.importorskip("tensorflow_serving.apis.prediction_service_pb2_grpc")
    from tests.export.stub_server import StubGrpcServer

    expected = ExportedTranslator(exported, signature="translate_greedy").translate(SENTENCES)
    with StubGrpcServer(exported / "1", lifetime=100) as stub:
        completed = run_client("--grpc", "--server", stub.address, "--signature",
                               "translate_greedy", "--json", *SENTENCES)
        assert completed.returncode == 0, completed.stderr.decode()[-3000:]
        results = [json.loads(line) for line in completed.stdout.decode("utf-8").splitlines()]
        assert [r["translation"] for r in results] == [e["translation"] for e in expected]
        assert [r["length"] for r in results] == [e["length"] for e in expected]
        failed = run_client("--grpc", "--server", stub.address, "--signature", "nope", "ka")
        assert failed.returncode == 1 and b"INVALID_ARGUMENT" in failed.stderr


def _load_client():
    import importlib.util

    spec = importlib.util.spec_from_file_location("tf_serving_client", CLIENT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_client_sends_length_sorted_batches_and_prints_in_input_order():
    client = _load_client()
    sentences = ["a much longer sentence than the others", "b", "cc", "a long one here",
                 "ddd", "", "eeee eeee"]
    requests = []

    def fake_predict(batch, **unused):
        requests.append(list(batch))
        return [{"translation": s.upper(), "score": -1.0, "length": len(s)} for s in batch]

    results = list(client.translate_all(sentences, fake_predict, batch_size=3))
    assert [r["translation"] for r in results] == [s.upper() for s in sentences]
    sent = [s for batch in requests for s in batch]
    assert sorted(sent) == sorted(sentences) and all(len(b) <= 3 for b in requests)
    lengths = [len(s.encode()) for s in sent]
    assert lengths == sorted(lengths), requests


def test_a_request_the_server_cannot_take_now_is_retried():
    # TF Serving answers UNAVAILABLE (HTTP 503) when its batching queue is full, and
    # RESOURCE_EXHAUSTED (429); a server restarting refuses connections. Those are retried
    # after a growing pause; any other error (a bad request) is reported at once.
    client = _load_client()
    failures = [client.ServerError("queue is full", retryable=True)] * 2
    calls, pauses = [], []

    def flaky_predict(batch, **unused):
        calls.append(list(batch))
        if failures:
            raise failures.pop()
        return [{"translation": s.upper(), "score": -1.0, "length": 1} for s in batch]

    results = list(client.translate_all(["ka", "lo"], flaky_predict, retries=3,
                                        sleep=pauses.append))
    assert [r["translation"] for r in results] == ["KA", "LO"]
    assert len(calls) == 3 and pauses == [0.5, 1.0]

    failures[:] = [client.ServerError("queue is full", retryable=True)] * 3
    with pytest.raises(client.ServerError, match="queue is full"):
        list(client.translate_all(["ka"], flaky_predict, retries=2, sleep=pauses.append))

    def bad_request(batch, **unused):
        calls.append(batch)
        raise client.ServerError("HTTP 400: no such signature")

    calls.clear()
    with pytest.raises(client.ServerError, match="HTTP 400"):
        list(client.translate_all(["ka"], bad_request, retries=3, sleep=pauses.append))
    assert len(calls) == 1


@pytest.mark.timeout(60)
def test_a_request_that_timed_out_is_not_sent_again():
    # The same slow batch again would only add to the server's load.
    client = _load_client()
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        with pytest.raises(client.ServerError) as error:
            client.predict_rest(["ka"], server=f"http://127.0.0.1:{silent.getsockname()[1]}",
                                timeout=0.5)
    assert not error.value.retryable
    assert "--timeout 0.5" in str(error.value)  # reached, but slow: not "Cannot reach"
    with pytest.raises(SystemExit):
        client._parse_args(["--retries", "-1"])
    for timeout in ("0", "-1", "nan"):
        with pytest.raises(SystemExit):
            client._parse_args(["--timeout", timeout, "ka"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("python", ["python3.9", "python3.8"])
def test_a_timeout_is_not_retried_on_older_pythons(python):
    # The client is standalone; before Python 3.10 a socket timeout is `socket.timeout`,
    # not a `TimeoutError`: it was taken for "Cannot reach" and the slow batch sent again.
    import glob
    import shutil

    # On PATH, or installed by pyenv without being selected (its shim then fails).
    found = [shutil.which(python),
             *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/*/bin/{python}")))]
    runnable = [path for path in found if path and subprocess.run(
        [path, "-c", "pass"], capture_output=True).returncode == 0]
    if not runnable:
        pytest.skip(f"no {python} on this machine")
    interpreter = runnable[0]
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        completed = subprocess.run(
            [interpreter, str(CLIENT), "--server", f"http://127.0.0.1:{silent.getsockname()[1]}",
             "--timeout", "1", "--retries", "2", "A dog runs."],
            capture_output=True, text=True, timeout=50)
    assert completed.returncode == 1, completed.stderr
    assert "did not answer within --timeout 1 seconds" in completed.stderr
    assert "retrying" not in completed.stderr


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_client_retries_a_full_queue_and_gives_up_after_its_retries(server, exported):
    expected = [r["translation"] for r in ExportedTranslator(exported).translate(["ka lo mi"])]
    server.reject_next(2, status=503, message="The batch scheduling queue to which this task "
                       "was submitted is full")
    completed = run_client("--server", server.url, "ka lo mi")
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.decode("utf-8").splitlines() == expected
    assert completed.stderr.count(b"retrying in") == 2 and b"HTTP 503" in completed.stderr

    server.reject_next(2, status=503, message="queue is full")
    completed = run_client("--server", server.url, "--retries", "1", "ka lo mi")
    assert completed.returncode == 1 and b"HTTP 503: queue is full" in completed.stderr


def test_a_sentence_argument_that_is_not_utf8_is_translated_with_replacements(monkeypatch,
                                                                             capsys):
    # Undecodable bytes on the command line reach Python as surrogates (surrogateescape):
    # encoding them to sort the batch crashed the client before any request.
    client = _load_client()
    sent = []

    def fake_predict(batch, **unused):
        sent.extend(batch)
        return [{"translation": s, "score": -1.0, "length": 1} for s in batch]

    monkeypatch.setattr(client, "predict_rest", fake_predict)
    assert client.main([b"caf\xe9 au lait".decode("utf-8", "surrogateescape")]) == 0
    assert sent == ["caf\ufffd au lait"]  # as stdin's invalid bytes
    assert capsys.readouterr().out == "caf\ufffd au lait\n"


def test_ctrl_c_ends_the_client_with_one_line_not_a_traceback(monkeypatch, capsys):
    client = _load_client()
    calls = []

    def fake_predict(batch, **unused):
        calls.append(batch)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return [{"translation": s, "score": -1.0, "length": 1} for s in batch]

    monkeypatch.setattr(client, "predict_rest", fake_predict)
    # A read-ahead buffer's translations are printed once it is done: none of these were.
    assert client.main(["--batch-size", "1", "a", "b", "c"]) == 130
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "\nInterrupted: the first 0 of 3 translations were printed.\n"


def test_a_closed_output_pipe_ends_the_client_quietly(monkeypatch, capsys):
    # `client.py < doc.txt | head -1`: the reader went away.
    client = _load_client()
    monkeypatch.setattr(client, "predict_rest", lambda batch, **unused: [
        {"translation": s, "score": -1.0, "length": 1} for s in batch])
    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert client.main(["a", "b"]) == 141  # 128 + SIGPIPE, as a shell reports a killed reader
    assert capsys.readouterr().err == ""


def test_stdin_is_translated_as_it_is_read(monkeypatch, capsys):
    # A slow pipe or a large file: each read-ahead buffer is sent once it is full, not after
    # the whole input has been read into memory.
    import io

    client = _load_client()
    lines_read = []

    class Stdin(io.RawIOBase):
        def __init__(self, lines):
            self.lines = iter(lines)

        def readable(self):
            return True

        def readline(self, size=-1):
            line = next(self.lines, b"")
            if line:
                lines_read.append(line)
            return line

        def __iter__(self):
            return iter(self.readline, b"")

    requests = []

    def fake_predict(batch, **unused):
        requests.append(len(lines_read))  # lines read when this request is sent
        return [{"translation": s.upper(), "score": -1.0, "length": 1} for s in batch]

    count = 4 * client.SORT_BUFFER_BATCHES + 5  # more than one read-ahead buffer
    lines = [f"sentence {i}\r\n".encode() for i in range(count)] + [b"caf\xe9"]
    monkeypatch.setattr(client, "predict_rest", fake_predict)
    monkeypatch.setattr(sys, "stdin", type("S", (), {"buffer": Stdin(lines)})())
    assert client.main(["--batch-size", "4"]) == 0
    assert requests[0] < len(lines)  # the first batch left before the input ended
    assert capsys.readouterr().out.split("\n")[:-1] == (
        [f"SENTENCE {i}" for i in range(count)] + ["CAF\ufffd"])


@pytest.mark.skipif(os.name != "posix", reason="select() on a pipe: POSIX")
@pytest.mark.timeout(60)
def test_a_line_typed_into_stdin_is_translated_before_the_next_one(monkeypatch, capsys):
    # `(echo "A dog runs."; sleep 8; echo ...) | client.py` printed nothing for 8 s: it
    # waited for 16 requests' worth of lines (--batch-size 1 too) before sending any.
    import threading

    client = _load_client()
    read_end, write_end = os.pipe()
    requests = []

    def fake_predict(batch, **unused):
        requests.append(list(batch))
        return [{"translation": s.upper(), "score": -1.0, "length": 1} for s in batch]

    monkeypatch.setattr(client, "predict_rest", fake_predict)
    stdin = os.fdopen(read_end, "rb")
    monkeypatch.setattr(sys, "stdin", type("S", (), {"buffer": stdin})())
    codes = []
    thread = threading.Thread(target=lambda: codes.append(client.main([])), daemon=True)
    thread.start()
    try:
        os.write(write_end, "\ufeffA dog runs.\r\nTwo men".encode())
        for _ in range(100):  # the first line is sent while the input stays open
            if requests:
                break
            thread.join(0.05)
        sent_early = list(requests)
        os.write(write_end, b" talk.\nA cat\xe9.\n")
    finally:
        os.close(write_end)  # the end of the input, whatever happened
    thread.join(30)
    stdin.close()
    assert sent_early == [["A dog runs."]]
    assert codes == [0]
    assert [sorted(batch) for batch in requests[1:]] == [["A cat\ufffd.", "Two men talk."]]
    assert capsys.readouterr().out.split("\n")[:-1] == [
        "A DOG RUNS.", "TWO MEN TALK.", "A CAT\ufffd."]


def test_a_request_above_the_servers_max_batch_size_is_sent_in_smaller_ones(capsys):
    # TF Serving refuses a request of more sentences than its max_batch_size (HTTP 400,
    # "Task size N is larger than maximum input batch size M"): the client sends that many
    # at a time instead of failing on a --batch-size above the server's.
    client = _load_client()
    sizes = []

    def predict(batch, **unused):
        sizes.append(len(batch))
        if len(batch) > 3:
            raise client.ServerError(
                "http://localhost:8501/v1/models/translator:predict answered HTTP 400: Task "
                f"size {len(batch)} is larger than maximum input batch size 3")
        return [{"translation": s.upper(), "score": -1.0, "length": 1} for s in batch]

    sentences = [f"s{i}" + "x" * (i % 4) for i in range(11)]
    results = list(client.translate_all(sentences, predict, batch_size=8,
                                        sort_buffer_batches=2))
    assert [r["translation"] for r in results] == [s.upper() for s in sentences]
    assert sizes == [8, 3, 3, 3, 2], sizes  # one refusal, then at most 3 a request
    assert capsys.readouterr().err.count("at most 3 sentences a request") == 1
    # Another error is not mistaken for it.
    with pytest.raises(client.ServerError, match="HTTP 400: bad input"):
        list(client.translate_all(["a", "b"], _raises(client.ServerError("HTTP 400: bad input"))))


def _raises(error):
    def predict(batch, **unused):
        raise error
    return predict


class _CannedAnswer:
    """A loopback HTTP server answering every POST with one status and body."""

    def __init__(self, status, body, length=None):
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *unused):
                pass

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                self.send_response(status)
                self.send_header("Content-Length", str(length or len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        return self

    def __exit__(self, *unused):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("status, body, message", [
    (200, b"<html>a proxy's page</html>", "not JSON"),
    (200, b"[1, 2]", "without 'predictions'"),
    (200, b'{"predictions": [{"translation": "x"}]}', "1 prediction(s) for 2 sentences"),
    (200, b'{"predictions": [{"score": 1.0}, {"score": 2.0}]}', "no 'translation'"),
    (400, b'["oops"]', "HTTP 400: [\"oops\"]"),
    # A null score: "float() argument must be ... not 'NoneType'", a traceback.
    (200, b'{"predictions": [{"translation": "x", "score": null}, {"translation": "y"}]}',
     "wrong type"),
    (200, b'{"predictions": [{"translation": null}, {"translation": "y"}]}', "wrong type"),
    # A connection cut in the middle of the body (IncompleteRead, a traceback).
    (200, b'{"predictions": [', "broken"),
])
def test_answers_a_server_should_not_give_are_server_errors(status, body, message):
    # A proxy's HTML page, an error body that is not an object or too few predictions ended
    # the client with a traceback (or, cut by zip, a NoneType error at the next line).
    client = _load_client()
    with _CannedAnswer(status, body, length=100 if message == "broken" else None) as server:
        with pytest.raises(client.ServerError, match=re.escape(message)):
            client.predict_rest(["ka", "lo"], server=server.url, timeout=10)


def test_a_batch_size_below_one_is_refused():
    client = _load_client()
    for size in ("0", "-3"):
        with pytest.raises(SystemExit):
            client._parse_args(["--batch-size", size, "ka"])


def test_a_translation_holding_line_breaks_is_printed_on_its_one_line(monkeypatch, capsys):
    # Each line break inside a translation (an undertrained or sampling model can emit
    # SentencePiece's byte pieces <0x0A>, <0x0D>) added lines: later lines moved.
    client = _load_client()
    monkeypatch.setattr(client, "predict_rest", lambda batch, **unused: [
        {"translation": s.replace(" ", "\r\n\n") + "\u2028\n", "score": -1.0, "length": 1}
        for s in batch])
    assert client.main(["a dog", "two men"]) == 0
    assert capsys.readouterr().out == "a dog\u2028\ntwo men\u2028\n"


@pytest.mark.parametrize("data, message", [
    ("A dog.\nTwo men.\n".encode("utf-16"), "UTF-16"),
    (b"A dog.\rTwo men.\rA cat.\r", "carriage return"),
])
def test_stdin_in_utf16_or_with_carriage_return_lines_is_refused(monkeypatch, capsys, data,
                                                                   message):
    # UTF-16 was sent as NUL-laced garbage (4 translations for 3 lines), classic Mac OS
    # text as one sentence, both with status 0; `keras-transformer translate` refuses them.
    import io

    client = _load_client()
    sent = []
    monkeypatch.setattr(client, "predict_rest", lambda batch, **unused: sent.append(batch) or [
        {"translation": s, "score": -1.0, "length": 1} for s in batch])
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert client.main([]) == 1
    assert message in capsys.readouterr().err and not sent



def test_stdin_with_doubled_carriage_returns_or_a_title_line_is_read(monkeypatch):
    # Lines ended by "\r\r\n" (CRLF written again in Windows' text mode), or a first line
    # holding carriage returns among ordinary ones, were refused as classic Mac OS text.
    import io

    client = _load_client()
    assert list(client.stdin_lines(io.BytesIO(b"A dog.\r\r\nTwo men.\r\r\n"))) == [
        "A dog.\r", "Two men.\r"]
    assert len(list(client.stdin_lines(io.BytesIO(b"T\rS\rB\n" + b"A dog.\n" * 3)))) == 4
