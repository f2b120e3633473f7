"""A stand-in for TF Serving's REST API, serving a SavedModel on 127.0.0.1 for tests.

It answers `POST /v1/models/<name>[/versions/<n>]:predict` like the model server does:

- request `{"signature_name": ..., "instances": [...]}` (row format; for a signature with one
  named input each instance is the plain value, or `{"text": value}`) -> response
  `{"predictions": [{"translation": ..., "score": ..., "length": ...}, ...]}` (one object per
  instance because the signature has several outputs);
- request `{"signature_name": ..., "inputs": [...] or {"text": [...]}}` (columnar format) ->
  `{"outputs": {"translation": [...], "score": [...], "length": [...]}}`;
- errors -> HTTP 400/404 with `{"error": "..."}`;
- `GET /v1/models/<name>` -> a model status document.

Strings travel as UTF-8 JSON strings (or `{"b64": ...}` objects, decoded to bytes). The server
listens only on loopback, on a free port chosen by the OS, in a daemon thread; every request
has a socket timeout, and the server shuts itself down after `lifetime` seconds even if a test
forgets to stop it.
"""

import base64
import http.server
import json
import re
import threading

import tensorflow as tf

_PREDICT = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?:predict$")
_STATUS = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/\d+)?$")
INPUT_NAME = "text"


def _decode_value(value):
    if isinstance(value, dict) and set(value) == {"b64"}:
        return base64.b64decode(value["b64"])
    if isinstance(value, str):
        return value.encode("utf-8")
    raise ValueError(f"expected a string input, got {value!r}")


def _to_json(value):
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value.item() if hasattr(value, "item") else value


class _Handler(http.server.BaseHTTPRequestHandler):
    timeout = 30  # seconds a connection may stay idle (socket timeout)
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002  (keep test output quiet)
        self.server.requests.append(self.requestline)

    def _reply(self, status, document):
        body = json.dumps(document).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        match = _STATUS.match(self.path)
        if not match or match["name"] != self.server.model_name:
            return self._reply(404, {"error": f"Servable not found for request: {self.path}"})
        return self._reply(200, {"model_version_status": [
            {"version": str(self.server.version), "state": "AVAILABLE",
             "status": {"error_code": "OK", "error_message": ""}}
        ]})

    def do_POST(self):  # noqa: N802
        match = _PREDICT.match(self.path)
        if not match or match["name"] != self.server.model_name:
            return self._reply(404, {"error": f"Servable not found for request: {self.path}"})
        with self.server.lock:
            rejection = self.server.rejections.pop(0) if self.server.rejections else None
        if rejection is not None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            return self._reply(rejection[0], {"error": rejection[1]})
        try:
            length = int(self.headers.get("Content-Length", 0))
            request = json.loads(self.rfile.read(length).decode("utf-8"))
            signature = request.get("signature_name", "serving_default")
            if signature not in self.server.signatures:
                raise ValueError(f"Serving signature name: \"{signature}\" not found in "
                                 "signature def")
            if "instances" in request:
                row_format = True
                values = [v[INPUT_NAME] if isinstance(v, dict) and "b64" not in v else v
                          for v in request["instances"]]
            elif "inputs" in request:
                row_format = False
                inputs = request["inputs"]
                values = inputs[INPUT_NAME] if isinstance(inputs, dict) else inputs
            else:
                raise ValueError("Missing 'instances' or 'inputs' key")
            texts = tf.constant(_decode_value(values) if isinstance(values, (str, dict))
                                else [_decode_value(v) for v in values], tf.string)
            with self.server.lock:  # one model call at a time, like a single session
                outputs = self.server.signatures[signature](**{INPUT_NAME: texts})
            columns = {key: [_to_json(v) for v in tensor.numpy().tolist()]
                       for key, tensor in outputs.items()}
        except (ValueError, KeyError, TypeError, tf.errors.OpError) as error:
            return self._reply(400, {"error": str(error)})
        if row_format:
            rows = [dict(zip(columns, values)) for values in zip(*columns.values())]
            return self._reply(200, {"predictions": rows})
        return self._reply(200, {"outputs": columns})


class StubModelServer:
    """Serves `saved_model_dir` on `http://127.0.0.1:<port>` until `stop()` or `lifetime` s.

    Args:
        saved_model_dir: str or path-like, the SavedModel version directory.
        model_name: str, the name in the URL. Defaults to `"translator"`.
        version: int, reported by the status endpoint. Defaults to `1`.
        lifetime: float, seconds after which the server stops by itself. Defaults to `300`.

    Example:
    >>> with StubModelServer(path) as server:
    ...     requests.post(server.url + "/v1/models/translator:predict", json=...)
    """

    def __init__(self, saved_model_dir, model_name="translator", version=1, lifetime=300.0):
        import tensorflow_text  # noqa: F401  (SentencePiece ops)

        loaded = tf.saved_model.load(str(saved_model_dir))
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.model_name = model_name
        self._httpd.version = version
        self._httpd.signatures = dict(loaded.signatures)
        self._httpd.lock = threading.Lock()
        self._httpd.requests = []
        self._httpd.rejections = []
        self._loaded = loaded  # keeps the restored resources alive
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True,
                                        kwargs={"poll_interval": 0.1})
        self._timer = threading.Timer(lifetime, self.stop)
        self._timer.daemon = True
        self._stopped = threading.Event()

    @property
    def port(self):
        return self._httpd.server_address[1]

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    @property
    def requests(self):
        """The request lines received so far (e.g. `POST /v1/models/translator:predict`)."""
        return list(self._httpd.requests)

    def reject_next(self, count, status=503, message="queue is full"):
        """Answers the next `count` predict requests with HTTP `status` and `message`, as
        the model server does when its batching queue is full (UNAVAILABLE: 503)."""
        with self._httpd.lock:
            self._httpd.rejections[:] = [(status, message)] * count

    def start(self):
        self._thread.start()
        self._timer.start()
        return self

    def stop(self):
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._timer.cancel()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()


class StubGrpcServer:
    """`tensorflow.serving.PredictionService/Predict` on 127.0.0.1 for a SavedModel.

    Needs `tensorflow-serving-api` (the generated protos and service stubs) and `grpcio`.
    Answers `PredictRequest`s for `model_name` with every output of the requested signature
    as a tensor proto, as the model server does; unknown models or signatures fail with
    `NOT_FOUND` / `INVALID_ARGUMENT`. Stops on `stop()` or after `lifetime` seconds.
    """

    def __init__(self, saved_model_dir, model_name="translator", version=1, lifetime=300.0):
        from concurrent import futures

        import grpc
        import tensorflow_text  # noqa: F401  (SentencePiece ops)
        from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

        loaded = tf.saved_model.load(str(saved_model_dir))
        signatures = dict(loaded.signatures)
        lock = threading.Lock()

        class Servicer(prediction_service_pb2_grpc.PredictionServiceServicer):
            def Predict(self, request, context):  # noqa: N802
                if request.model_spec.name != model_name:
                    context.abort(grpc.StatusCode.NOT_FOUND,
                                  f"Servable not found for request: {request.model_spec.name}")
                name = request.model_spec.signature_name or "serving_default"
                if name not in signatures:
                    context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                  f"Serving signature name: \"{name}\" not found")
                text = tf.make_ndarray(request.inputs[INPUT_NAME])
                with lock:
                    outputs = signatures[name](**{INPUT_NAME: tf.constant(text, tf.string)})
                response = predict_pb2.PredictResponse()
                response.model_spec.CopyFrom(request.model_spec)
                response.model_spec.version.value = version
                for key, value in outputs.items():
                    response.outputs[key].CopyFrom(tf.make_tensor_proto(value.numpy()))
                return response

        self._loaded = loaded
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(
            Servicer(), self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")
        self._timer = threading.Timer(lifetime, self.stop)
        self._timer.daemon = True

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def start(self):
        self._server.start()
        self._timer.start()
        return self

    def stop(self):
        self._timer.cancel()
        self._server.stop(grace=1).wait(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()
