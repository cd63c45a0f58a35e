"""qkern.torch's GEMM ops, ``qkern::weight_int8pack_mm`` and ``qkern::woq_linear``: inputs
that require grad (no autograd formula), argument errors (eager and at trace time),
opcheck, torch.compile, torch.export, and torch's flush-to-zero; and which calls of
all four GEMM ops (the int4 ones too) skip the custom op.

Parity of the op with torch._weight_int8pack_mm over a hypothesis sweep is in
test_torch_parity.py; the conv ops are in test_torch_qconv.py.
"""

import numpy as np
import pytest

import qkern
from qkern.dispatch import INT8
from reference import BF16, DTYPES

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
import qkern.torch as qt  # noqa: E402  (needs torch)
from torch_support import DTYPE_IDS, bits, to_numpy, to_torch, woq_problem  # noqa: E402


def test_op_needs_no_autograd_and_runs_on_inputs_that_require_grad():
    x, w, s = woq_problem(np.dtype(np.float32))
    tx = to_torch(x).requires_grad_()
    y = qt.weight_int8pack_mm(tx, to_torch(w), to_torch(s))
    assert np.array_equal(bits(y), qkern.weight_int8pack_mm(x, w, s).view(np.uint8))
    with pytest.raises(RuntimeError, match="no autograd formula"):
        y.sum().backward()


# ---- plain eager calls skip the custom op --------------------------------------

GEMM_OPS = ["weight_int8pack_mm", "woq_linear", "weight_int4pack_mm", "int4_linear"]


def _gemm_call(name: str) -> tuple:
    """``(x, call, op arguments after x)``: an entry point of op ``name`` on plain CPU
    tensors, and what ``torch.ops.qkern.<name>`` takes for the same call."""
    x, w, s = woq_problem(np.dtype(np.float32), m=3, n=40, k=64)
    tx, tw, ts = to_torch(x), to_torch(w), to_torch(s)
    if name == "weight_int8pack_mm":
        return tx, lambda x: qt.weight_int8pack_mm(x, tw, ts), (tw, ts)
    if name == "woq_linear":
        layer = qt.WoqLinear(tw, ts)
        return tx, layer, (layer._key,)
    q, sz = qkern.quantize_int4(w.astype(np.float32), 32)
    tq, tsz = torch.from_numpy(qkern.pack_int4(q)), torch.from_numpy(sz)
    if name == "weight_int4pack_mm":
        return tx, lambda x: qt.weight_int4pack_mm(x, tq, 32, tsz), (tq, 32, tsz)
    layer = qt.Int4Linear(tq, 32, tsz)
    return tx, layer, (layer._key,)


class _RecordOps(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the name of each op dispatched under it."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("name", GEMM_OPS)
def test_plain_eager_calls_skip_the_op(name, monkeypatch):
    """Plain CPU tensors in eager mode (grad mode on or off, inference mode) run the
    op's implementation without the op, with its bits; an input that requires grad
    under grad mode, a Parameter, a dispatch mode, the profilers and torch.jit.trace
    go through the op."""
    tx, call, args = _gemm_call(name)
    expect = getattr(torch.ops.qkern, name)(tx, *args)
    with _RecordOps() as mode:
        assert torch.equal(call(tx), expect)
    assert f"qkern.{name}.default" in mode.names

    def refuse(*args):
        raise AssertionError(f"the custom op {name} was called")

    monkeypatch.setattr(torch.ops.qkern, name, refuse)
    assert torch.equal(call(tx), expect)
    with torch.no_grad():
        assert torch.equal(call(tx.clone().requires_grad_()), expect)
    with torch.inference_mode():
        assert torch.equal(call(tx.clone()), expect)
    for routed in (tx.clone().requires_grad_(), torch.nn.Parameter(tx.clone())):
        with pytest.raises(AssertionError, match="custom op"):
            call(routed)
    with _RecordOps(), pytest.raises(AssertionError, match="custom op"):
        call(tx)
    for profiler in (torch.profiler.profile, torch.autograd.profiler_legacy.profile):
        with profiler(), pytest.raises(AssertionError, match="custom op"):
            call(tx)
    with torch.no_grad(), pytest.raises(AssertionError, match="custom op"):
        torch.jit.trace(call, tx)


def test_a_pytorch_without_the_private_hooks_takes_the_op(monkeypatch):
    """plain_eager asks private PyTorch functions; where one is missing, every call
    takes the op rather than failing."""
    from qkern.torch import _interop

    assert _interop.plain_eager(torch.ones(2))
    monkeypatch.delattr(torch._C, "_len_torch_dispatch_stack")
    assert _interop._skipping_hooks() is None
    monkeypatch.setattr(_interop, "_HOOKS", None)
    assert not _interop.plain_eager(torch.ones(2))


def test_the_plain_keys_do_not_depend_on_the_first_calls_mode(monkeypatch):
    """The dispatch keys of a plain tensor are made on the first call that asks: one
    under inference mode, or one under torch.device('meta') (which takes the op),
    leaves ordinary tensors on the shortcut afterwards."""
    from qkern.torch import _interop

    tx, call, args = _gemm_call("woq_linear")
    expect = torch.ops.qkern.woq_linear(tx, *args)

    def refuse(*args):
        raise AssertionError("the custom op woq_linear was called")

    for first_mode in (torch.inference_mode, lambda: torch.device("meta")):
        monkeypatch.setattr(_interop, "_plain_keys", ())
        with first_mode():
            _interop.plain_eager(torch.ones(2, device="cpu"))
        with monkeypatch.context() as patch:
            patch.setattr(torch.ops.qkern, "woq_linear", refuse)
            with torch.no_grad():
                assert torch.equal(call(tx), expect)
            with torch.inference_mode():
                assert torch.equal(call(tx.clone()), expect)


def _ok():
    return (torch.ones(2, 4), torch.ones(3, 4, dtype=torch.int8), torch.ones(3))


@pytest.mark.parametrize("change, exc, match", [
    (lambda x, w, s: (x.double(), w, s.double()), TypeError, "x: expected dtype float32, float16"),
    (lambda x, w, s: (x.to(torch.int8), w, s.to(torch.int8)), TypeError, "x: expected dtype"),
    (lambda x, w, s: (x, w, s.half()), TypeError, r"scales: expected dtype torch.float32 \(the"),
    (lambda x, w, s: (x, w.float(), s), TypeError, "w: expected dtype int8"),
    (lambda x, w, s: (x, w.to(torch.uint8), s), TypeError, "w: expected dtype int8"),
    (lambda x, w, s: (x, w[0], s), ValueError, r"w: expected shape \(N, K\)"),
    (lambda x, w, s: (x, torch.ones(4, 3, dtype=torch.int8).t(), s), ValueError,
     "w: expected a contiguous"),
    (lambda x, w, s: (x, w, torch.ones(2)), ValueError, r"scales: expected shape \(3,\)"),
    (lambda x, w, s: (x, w, torch.ones(3, 1)), ValueError, r"scales: expected shape \(3,\)"),
    (lambda x, w, s: (torch.ones(2, 5), w, s), ValueError, "x: expected last dimension K=4"),
    (lambda x, w, s: (torch.tensor(1.0), w, s), ValueError, "x: expected shape"),
    (lambda x, w, s: (x.to("meta"), w, s), ValueError, "x: expected a CPU tensor, got device meta"),
    (lambda x, w, s: (x, w.to("meta"), s), ValueError, "w: expected a CPU tensor"),
    (lambda x, w, s: (x, w, s.to("meta")), ValueError, "scales: expected a CPU tensor"),
])
def test_op_bad_arguments(change, exc, match):
    with pytest.raises(exc, match=match):
        qt.weight_int8pack_mm(*change(*_ok()))


@pytest.mark.parametrize("name", ["weight_int8pack_mm", "weight_int4pack_mm"])
def test_an_x_of_no_activation_dtype_is_named_before_the_scales(name):
    """float64 x with float32 scales: the error is x's dtype, not the scales' (which
    would then have to be float64, a dtype no op takes)."""
    tx, call, args = _gemm_call(name)
    with pytest.raises(TypeError, match="x: expected dtype float32, float16 or bfloat16, got "
                                        "torch.float64"):
        call(tx.double())


def test_op_bad_arguments_raise_when_compiled_too():
    """The fake implementation checks as the eager one does, at trace time."""
    f = torch.compile(qt.weight_int8pack_mm, backend="eager", fullgraph=True)
    x, w, s = _ok()
    with pytest.raises(Exception, match="x: expected last dimension K=4"):
        f(torch.ones(2, 5), w, s)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_opcheck(dtype):
    """Schema, fake tensor, autograd registration and AOT dispatch of both ops."""
    x, w, s = woq_problem(dtype)
    tx, tw, ts = to_torch(x), to_torch(w), to_torch(s)
    layer = qt.WoqLinear(tw, ts)
    strided = (tx.reshape(5, 2, 24)[:, 1], tw[:, :24].contiguous(), ts)  # rows 48 apart
    mm, linear = torch.ops.qkern.weight_int8pack_mm.default, torch.ops.qkern.woq_linear.default
    for op, args in [(mm, (tx, tw, ts)), (mm, strided), (linear, (tx, layer._key))]:
        result = torch.library.opcheck(op, args)
        assert set(result.values()) == {"SUCCESS"}, result


# ---- torch.compile and torch.export ------------------------------------------


def test_compile_fullgraph_matches_eager():
    """One inductor graph holding both custom ops, dynamic in M, equals eager bit for bit."""
    x, w, s = woq_problem(BF16, m=9, n=40, k=64)
    tw, ts = to_torch(w), to_torch(s)
    layer = qt.WoqLinear.from_linear(torch.nn.Linear(40, 24), dtype=torch.bfloat16)

    def f(x):
        return layer(torch.relu(qt.weight_int8pack_mm(x * 2, tw, ts)))

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        from torch._inductor.compile_fx import compile_fx
        return compile_fx(gm, example_inputs)

    compiled = torch.compile(f, backend=backend, fullgraph=True, dynamic=True)
    for m in (9, 3):
        tx = to_torch(x[:m])
        assert torch.equal(compiled(tx), f(tx))
    assert len(graphs) == 1
    targets = {node.target for node in graphs[0].graph.nodes}
    assert {torch.ops.qkern.weight_int8pack_mm, torch.ops.qkern.woq_linear} <= targets


def test_export_holds_the_ops():
    x, w, s = woq_problem(np.dtype(np.float32), n=40)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("w", to_torch(w))
            self.register_buffer("s", to_torch(s))
            self.out = qt.WoqLinear.from_linear(torch.nn.Linear(40, 8))

        def forward(self, x):
            return self.out(qt.weight_int8pack_mm(x, self.w, self.s))

    model, tx = Model(), to_torch(x)
    program = torch.export.export(model, (tx,))
    targets = {node.target for node in program.graph.nodes}
    assert {torch.ops.qkern.weight_int8pack_mm.default,
            torch.ops.qkern.woq_linear.default} <= targets
    assert torch.equal(program.module()(tx), model(tx))


# ---- torch's flush-to-zero ---------------------------------------------------


def test_torch_flush_denormal_changes_no_bit():
    """The issue's case: after torch.set_flush_denormal(True) in the calling
    thread, one and two threads gave different bits for subnormal
    activations (the caller's columns flushed, the OpenMP worker's not).
    Every thread now runs under IEEE 754 defaults (more in test_fpenv.py).
    The layer runs the highest kernel with gradual underflow: the AMX and
    AVX-512-BF16 ones flush subnormals in every mode (docs/semantics.rst)."""
    w = np.ones((2048, 2048), np.int8)
    s = np.ones(2048, np.float32)
    gradual = [k for k in qkern.kernels() if k.available and "float32" in k.dtypes
               and k.weight_format == INT8 and k.kind != "unpacked" and not k.flushes_subnormals]
    layer = qkern.WoqLinear(w, s, kernel=gradual[-1].name)
    x = np.full((1, 2048), 1e-42, np.float32)
    want = layer(x, num_threads=2).view(np.uint32)  # starts the OpenMP worker too
    assert (want != 0).all()  # 2048 * 1e-42, kept by gradual underflow
    if not torch.set_flush_denormal(True):
        pytest.skip("torch cannot set flush-to-zero on this CPU")
    threads = torch.get_num_threads()
    try:
        assert (torch.tensor([1e-42]) * 1 == 0).all()  # torch's flush is on
        got = [layer(x, num_threads=t).view(np.uint32) for t in (1, 2)]
        torch.set_num_threads(2)
        got.append(to_numpy(qt.weight_int8pack_mm(torch.from_numpy(x), torch.from_numpy(w),
                                                  torch.from_numpy(s))).view(np.uint32))
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
    for result in got:
        assert np.array_equal(result, want)
