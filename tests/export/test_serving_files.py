"""The TF Serving files of `export/` parse as the protos and compose file they claim to be."""

import ast
import pathlib
import sys

import pytest
import yaml
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format
from google.protobuf import wrappers_pb2  # noqa: F401  (puts wrappers.proto in the pool)

EXPORT_DIR = pathlib.Path(__file__).resolve().parents[2] / "export"

# The fields of tensorflow.serving.BatchingParameters (session_bundle_config.proto, not
# shipped in tensorflow-serving-api) that a batching file may set, with their types.
_BATCHING_FIELDS = {
    "max_batch_size": "Int64Value",
    "batch_timeout_micros": "Int64Value",
    "max_enqueued_batches": "Int64Value",
    "num_batch_threads": "Int64Value",
    "thread_pool_name": "StringValue",
    "enable_large_batch_splitting": "BoolValue",
    "max_execution_batch_size": "Int64Value",
    "allowed_batch_sizes": "repeated int64",
    "pad_variable_length_inputs": "bool",
}


def batching_parameters_class():
    """A message class with BatchingParameters' field names and types, for parsing."""
    file_proto = descriptor_pb2.FileDescriptorProto(
        name="kt_test_batching.proto", package="kt_test",
        dependency=["google/protobuf/wrappers.proto"], syntax="proto3")
    message = file_proto.message_type.add(name="BatchingParameters")
    for number, (name, kind) in enumerate(_BATCHING_FIELDS.items(), start=1):
        field = message.field.add(name=name, number=number)
        if kind == "repeated int64":
            field.type, field.label = field.TYPE_INT64, field.LABEL_REPEATED
        elif kind == "bool":
            field.type, field.label = field.TYPE_BOOL, field.LABEL_OPTIONAL
        else:
            field.type, field.label = field.TYPE_MESSAGE, field.LABEL_OPTIONAL
            field.type_name = f".google.protobuf.{kind}"
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(file_proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("kt_test.BatchingParameters"))


def test_models_config_serves_the_latest_translator():
    config_pb2 = pytest.importorskip("tensorflow_serving.config.model_server_config_pb2")
    config = text_format.Parse((EXPORT_DIR / "models.config").read_text(),
                               config_pb2.ModelServerConfig())
    (model,) = config.model_config_list.config
    assert model.name == "translator"
    assert model.base_path == "/models/translator"
    assert model.model_platform == "tensorflow"
    assert model.model_version_policy.WhichOneof("policy_choice") == "latest"
    assert model.model_version_policy.latest.num_versions == 1


def test_batching_parameters_parse():
    parameters = text_format.Parse((EXPORT_DIR / "batching_parameters.txt").read_text(),
                                   batching_parameters_class()())
    assert 1 <= parameters.max_batch_size.value <= 512
    assert 0 < parameters.batch_timeout_micros.value <= 100_000
    assert parameters.num_batch_threads.value >= 1
    assert parameters.max_enqueued_batches.value >= 1


def test_compose_file_wires_the_config_files_and_ports():
    compose = yaml.safe_load((EXPORT_DIR / "docker-compose.yml").read_text())
    (service,) = compose["services"].values()
    assert service["image"].startswith("tensorflow/serving:")
    assert {"8500:8500", "8501:8501"} <= set(service["ports"])
    flags = dict(arg.lstrip("-").split("=", 1) for arg in service["command"])
    assert flags["rest_api_port"] == "8501" and flags["port"] == "8500"
    assert flags["enable_batching"] == "true"
    # The measured serving setting: one thread per op, as many ops at once as batch threads.
    batching = text_format.Parse((EXPORT_DIR / "batching_parameters.txt").read_text(),
                                 batching_parameters_class()())
    assert flags["tensorflow_intra_op_parallelism"] == "1"
    assert int(flags["tensorflow_inter_op_parallelism"]) == batching.num_batch_threads.value
    mounts = {}
    for volume in service["volumes"]:
        for mode in (":ro", ":rw"):
            volume = volume.removesuffix(mode)
        host, container = volume.rsplit(":", 1)  # the host side may hold ${VAR:-default}
        mounts[container] = host
    # The config files mounted are the ones in export/, where the flags point.
    for flag, name in (("model_config_file", "models.config"),
                       ("batching_parameters_file", "batching_parameters.txt")):
        assert (EXPORT_DIR / mounts[flags[flag]]).resolve() == EXPORT_DIR / name
    # The model base directory is mounted where models.config says it is.
    assert "/models/translator" in mounts
    assert "../runs/quick/export" in mounts["/models/translator"]


def test_client_needs_only_the_standard_library_at_import():
    tree = ast.parse((EXPORT_DIR / "client.py").read_text())
    top_level = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top_level |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            top_level.add(node.module.split(".")[0])
    assert top_level <= set(sys.stdlib_module_names), top_level


def test_compose_pins_an_existing_tf_serving_release_and_the_readme_gives_the_rule():
    from keras_transformer.export.op_check import TF_SERVING_VERSION

    compose = yaml.safe_load((EXPORT_DIR / "docker-compose.yml").read_text())
    (service,) = compose["services"].values()
    # 2.20.0 is the newest tensorflow/serving release; the op check compares with its ops.
    assert service["image"] == f"tensorflow/serving:${{TF_SERVING_TAG:-{TF_SERVING_VERSION}}}"
    readme = " ".join((EXPORT_DIR / "README.md").read_text().split())
    assert "at least as new as the TensorFlow that exported the model" in readme
    assert "2.21.0" not in service["image"]
