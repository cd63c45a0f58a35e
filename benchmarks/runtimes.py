"""The inference runtimes as peers of qkern's int8 WoQ GEMM: OpenVINO and
ONNX Runtime, each where installed (``pip install qkern[bench]``).

Each runs the same problem as ``qkern.WoqLinear`` in float32, ``y = x @
(w * scales[:, None]).T``, with the weight kept in 8 bits:

* **OpenVINO**: an int8 ``Constant`` -> ``Convert`` (f32) -> ``Multiply``
  (per-row scale) -> ``MatMul`` graph, compiled for the CPU with f32
  inference precision, one stream and the benchmark's thread count. Its CPU
  plugin fuses that pattern into one ``FullyConnected`` node that keeps the
  weight in int8 (decompressed inside its kernel); :func:`openvino_peer`
  checks that in the compiled model and refuses to time it otherwise.
* **ONNX Runtime** ``com.microsoft.MatMulNBits`` with ``bits = 8``: the
  weight as unsigned bytes ``w + 128`` (its default zero point for 8 bits is
  128) in blocks of 256 along K, each block with its row's scale (the
  operator takes block sizes 16 to 256 only, so per-row scales are
  repeated). ``accuracy_level = 0`` computes in float32, like qkern;
  ``accuracy_level = 4`` quantizes the activations to int8 per block, a
  different and less exact computation, labelled as such.

Every peer gets ``copies`` compiled instances (each owning its weight), used
in turn, so that its weights are cold like qkern's.
"""

from __future__ import annotations

import importlib.util
import itertools

import numpy as np

ORT_BLOCK = 256


def available() -> dict:
    """``{runtime: version or None}`` for OpenVINO and ONNX Runtime."""
    out = {}
    for name, module in (("openvino", "openvino"), ("onnxruntime", "onnxruntime")):
        out[name] = None
        if importlib.util.find_spec(module) is not None:
            out[name] = __import__(module).__version__
    return out


def _rotating(items: list):
    cycle = itertools.cycle(items)
    return lambda: next(cycle)


def _openvino_model(w: np.ndarray, scales: np.ndarray, threads: int):
    import openvino as ov
    import openvino.opset13 as ops

    n, k = w.shape
    x = ops.parameter([-1, k], ov.Type.f32, name="x")
    weight = ops.multiply(ops.convert(ops.constant(w), ov.Type.f32),
                          ops.constant(scales.astype(np.float32).reshape(n, 1)))
    y = ops.matmul(x, weight, transpose_a=False, transpose_b=True)
    config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1,
              "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
    return ov.Core().compile_model(ov.Model([y], [x]), "CPU", config)


def weight_kept_in_int8(compiled) -> bool:
    """Whether OpenVINO's compiled model runs its matmul on int8 weights."""
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        if "layerType" in info and info["layerType"].astype(str) == "FullyConnected":
            return info["runtimePrecision"].astype(str) == "i8" if "runtimePrecision" in info \
                else False
    return False


def openvino_peer(w: np.ndarray, scales: np.ndarray, threads: int, copies: int):
    """A callable ``f(x) -> y`` running OpenVINO's int8-compressed MatMul on
    the next of ``copies`` compiled models, or None when OpenVINO is absent.

    Raises
    ------
    RuntimeError
        If the compiled model does not keep the weight in int8.
    """
    if available()["openvino"] is None:
        return None
    models = [_openvino_model(w, scales, threads) for _ in range(copies)]
    if not weight_kept_in_int8(models[0]):
        raise RuntimeError("OpenVINO decompressed the int8 weight at compile time: "
                           "its times would not be of an int8 WoQ matmul")
    requests = _rotating([m.create_infer_request() for m in models])
    return lambda x: requests().infer({0: x})[0]


def _ort_session(w: np.ndarray, scales: np.ndarray, threads: int, accuracy_level: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    n, k = w.shape
    blocks = -(-k // ORT_BLOCK)
    stored = np.full((n, blocks * ORT_BLOCK), 128, np.uint8)  # zero beyond K
    stored[:, :k] = (w.astype(np.int16) + 128).astype(np.uint8)
    node = helper.make_node("MatMulNBits", ["A", "B", "scales"], ["Y"], domain="com.microsoft",
                            K=k, N=n, bits=8, block_size=ORT_BLOCK,
                            accuracy_level=accuracy_level)
    graph = helper.make_graph(
        [node], "woq", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])],
        initializer=[
            numpy_helper.from_array(stored.reshape(n, blocks, ORT_BLOCK), "B"),
            numpy_helper.from_array(
                np.repeat(scales.astype(np.float32)[:, None], blocks, axis=1).ravel(),
                "scales")])
    model = helper.make_model(graph, ir_version=10, opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def onnxruntime_peer(w: np.ndarray, scales: np.ndarray, threads: int, copies: int,
                     accuracy_level: int):
    """A callable ``f(x) -> y`` running ONNX Runtime's ``MatMulNBits`` (bits = 8)
    on the next of ``copies`` sessions, or None when ONNX Runtime is absent."""
    if available()["onnxruntime"] is None:
        return None
    sessions = _rotating([_ort_session(w, scales, threads, accuracy_level)
                          for _ in range(copies)])
    return lambda x: sessions().run(None, {"A": x})[0]
