"""The inference runtimes as peers of qkern's WoQ GEMMs: OpenVINO and
ONNX Runtime, each where installed (``pip install qkern[bench]``).

Each runs the same problem as ``qkern.WoqLinear`` in float32, ``y = x @
(w * scales[:, None]).T``, with the weight kept in 8 bits (or, for the int4
peers, as ``qkern.Int4Linear``, with the weight kept in 4 bits: OpenVINO's
``u4`` weight compression and ``MatMulNBits`` with ``bits = 4``, each with
a scale and an integer zero point per group):

* **OpenVINO**: an int8 ``Constant`` -> ``Convert`` (f32) -> ``Multiply``
  (per-row scale) -> ``MatMul`` graph, compiled for the CPU with f32
  inference precision, one stream and the benchmark's thread count, and
  with its dynamic quantization off: on CPUs with AMX or VNNI its default
  quantizes the activations to int8 in groups of 32, another computation
  (relative error 5e-3 against the float32 result). Its CPU
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


class Peer:
    """``peer(x) -> y`` on the next of several compiled copies, in turn;
    ``peer.warm(x)`` runs ``x`` once on every copy. A runtime may compile
    code for each new input shape on a copy's first call with it (OpenVINO
    does, for 0.1-0.2 s): the benchmark warms every copy with the rows it is
    about to time, so that no timed call pays for that."""

    def __init__(self, copies: list, run):
        self._copies, self._run = copies, run
        self._cycle = itertools.cycle(copies)

    def __call__(self, x):
        return self._run(next(self._cycle), x)

    def warm(self, x) -> None:
        for _ in self._copies:
            self(x)


def _openvino_model(w: np.ndarray, scales: np.ndarray, threads: int):
    import openvino as ov
    import openvino.opset13 as ops

    n, k = w.shape
    x = ops.parameter([-1, k], ov.Type.f32, name="x")
    weight = ops.multiply(ops.convert(ops.constant(w), ov.Type.f32),
                          ops.constant(scales.astype(np.float32).reshape(n, 1)))
    return _compile_openvino(ops.matmul(x, weight, transpose_a=False, transpose_b=True), x,
                             threads)


def _compile_openvino(y, x, threads: int):
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1,
              "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
              "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0}
    return ov.Core().compile_model(ov.Model([y], [x]), "CPU", config)


def _openvino_int4_model(q: np.ndarray, zero_points: np.ndarray, scales: np.ndarray,
                         threads: int):
    import openvino as ov
    import openvino.opset13 as ops

    n, groups, group_size = q.shape
    x = ops.parameter([-1, groups * group_size], ov.Type.f32, name="x")
    weight = ops.multiply(
        ops.subtract(ops.convert(ops.constant(q, dtype=ov.Type.u4), ov.Type.f32),
                     ops.convert(ops.constant(zero_points[..., None], dtype=ov.Type.u4),
                                 ov.Type.f32)),
        ops.constant(scales[..., None].astype(np.float32)))
    weight = ops.reshape(weight, ops.constant(np.array([n, groups * group_size], np.int64)),
                         False)
    return _compile_openvino(ops.matmul(x, weight, transpose_a=False, transpose_b=True), x,
                             threads)


def weight_precision(compiled) -> str | None:
    """The precision OpenVINO's compiled model runs its matmul's weight in."""
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        if "layerType" in info and info["layerType"].astype(str) == "FullyConnected":
            return info["runtimePrecision"].astype(str) if "runtimePrecision" in info else None
    return None


def openvino_int4_peer(q: np.ndarray, zero_points: np.ndarray, scales: np.ndarray,
                       threads: int, copies: int):
    """A callable ``f(x) -> y`` running OpenVINO's int4-compressed MatMul,
    ``W[n, g*G + i] = (q[n, g, i] - zero_points[n, g]) * scales[n, g]``, on
    the next of ``copies`` compiled models; None when OpenVINO is absent.

    Raises
    ------
    RuntimeError
        If the compiled model does not keep the weight in 4 bits.
    """
    if available()["openvino"] is None:
        return None
    models = [_openvino_int4_model(q, zero_points, scales, threads) for _ in range(copies)]
    if weight_precision(models[0]) != "u4":
        raise RuntimeError("OpenVINO decompressed the int4 weight at compile time: "
                           "its times would not be of an int4 WoQ matmul")
    return Peer([m.create_infer_request() for m in models],
                lambda request, x: request.infer({0: x})[0])


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
    if weight_precision(models[0]) != "i8":
        raise RuntimeError("OpenVINO decompressed the int8 weight at compile time: "
                           "its times would not be of an int8 WoQ matmul")
    return Peer([m.create_infer_request() for m in models],
                lambda request, x: request.infer({0: x})[0])


def _ort_session(blocks: np.ndarray, scales: np.ndarray, zero_points, k: int, bits: int,
                 block_size: int, threads: int, accuracy_level: int):
    """A session of one ``MatMulNBits``: ``blocks`` (N, blocks, block bytes)
    as the operator stores B, f32 ``scales`` (N * blocks), packed uint8
    ``zero_points`` or None (the operator's default)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    n = blocks.shape[0]
    inputs = ["A", "B", "scales"] + (["zero_points"] if zero_points is not None else [])
    node = helper.make_node("MatMulNBits", inputs, ["Y"], domain="com.microsoft",
                            K=k, N=n, bits=bits, block_size=block_size,
                            accuracy_level=accuracy_level)
    initializers = [numpy_helper.from_array(blocks, "B"),
                    numpy_helper.from_array(scales.astype(np.float32).ravel(), "scales")]
    if zero_points is not None:
        initializers.append(numpy_helper.from_array(zero_points.ravel(), "zero_points"))
    graph = helper.make_graph(
        [node], "woq", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])],
        initializer=initializers)
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
    n, k = w.shape
    blocks = -(-k // ORT_BLOCK)
    stored = np.full((n, blocks * ORT_BLOCK), 128, np.uint8)  # zero beyond K
    stored[:, :k] = (w.astype(np.int16) + 128).astype(np.uint8)
    block_scales = np.repeat(scales.astype(np.float32)[:, None], blocks, axis=1)
    return _ort_peer([_ort_session(stored.reshape(n, blocks, ORT_BLOCK), block_scales, None, k,
                                   8, ORT_BLOCK, threads, accuracy_level)
                      for _ in range(copies)])


def onnxruntime_int4_peer(q: np.ndarray, zero_points: np.ndarray, scales: np.ndarray,
                          threads: int, copies: int, accuracy_level: int):
    """A callable ``f(x) -> y`` running ONNX Runtime's ``MatMulNBits`` (bits =
    4, block = the group) on the weight of :func:`openvino_int4_peer`, on the
    next of ``copies`` sessions; None when ONNX Runtime is absent. The
    operator stores two values a byte, the even k in the low nibble, and
    two zero points a byte, the even group in the low nibble."""
    if available()["onnxruntime"] is None:
        return None
    n, groups, group_size = q.shape
    blocks = (q[..., 0::2] | q[..., 1::2] << 4).astype(np.uint8)
    padded = np.zeros((n, groups + groups % 2), np.uint8)
    padded[:, :groups] = zero_points
    packed_zero_points = (padded[:, 0::2] | padded[:, 1::2] << 4).astype(np.uint8)
    return _ort_peer([_ort_session(blocks, scales, packed_zero_points, groups * group_size, 4,
                                   group_size, threads, accuracy_level)
                      for _ in range(copies)])


def _ort_peer(sessions: list):
    return Peer(sessions, lambda session, x: session.run(None, {"A": x})[0])
