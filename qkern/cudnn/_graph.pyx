"""Tier 3 of the cuDNN layer: the qconv graph, its engine configs and plans.

:class:`QConvGraph` builds and finalizes every descriptor of one
:class:`~qkern.cudnn._spec.GraphSpec` in one form:

- ``"virtual"``: the conv output, the bias sum and the ReLU output are
  virtual tensors that never reach device memory;
- ``"inplace"``: the seed's form, for engines that need them real: one fp32
  scratch buffer of the output's shape serves all three, each with its own
  uid (``UIDS``).

It owns its descriptors and destroys them, operations before tensors, when
it is collected or when building fails halfway.  :class:`ExecutionPlan`
holds one finalized plan and the graph it was built from.
"""
from qkern.cudnn._backend cimport Descriptor, Handle

from qkern.cudnn._backend import (CROSS_CORRELATION, DATA_FLOAT, DATA_INT8, DATA_INT32,
                                  HEUR_MODE_A, HEUR_MODE_FALLBACK, POINTWISE_ADD,
                                  POINTWISE_MUL, POINTWISE_RELU_FWD, execute)
from qkern.cudnn._errors import CudnnError
from qkern.cudnn._spec import FORMS, UIDS

HEURISTIC_MODES = {"A": HEUR_MODE_A, "FALLBACK": HEUR_MODE_FALLBACK}


cdef class QConvGraph:
    """The finalized operation graph of ``spec`` in ``form``.

    Parameters
    ----------
    spec : GraphSpec
    form : {"virtual", "inplace"}
    handle : Handle, optional
        Attached to the operation graph (needed for heuristics); without it
        the graph still finalizes, which is what the no-GPU tests check.

    Raises
    ------
    CudnnError
        Naming the descriptor and attribute that failed, and the problem.
    """

    cdef readonly object spec
    cdef readonly str form
    cdef readonly list roles
    cdef list _owned
    cdef Descriptor _graph

    def __init__(self, spec, str form="virtual", Handle handle=None):
        if form not in FORMS:
            raise ValueError(f"form: expected one of {FORMS}, got {form!r}")
        self.spec, self.form, self._owned, self.roles = spec, form, [], []
        try:
            self._build(handle)
        except CudnnError as e:
            self.destroy()
            raise e.with_problem(f"{form} form, {spec.describe()}") from None

    def __dealloc__(self):
        self.destroy()

    def destroy(self):
        """Destroy every descriptor, the graph first and tensors last."""
        for d in reversed(self._owned or []):
            (<Descriptor>d).destroy()
        self._owned = []
        self._graph = None

    cdef Descriptor _new(self, str role, str kind):
        d = Descriptor(kind, role)
        self._owned.append(d)
        self.roles.append((role, d))
        return d

    cdef Descriptor _tensor(self, str role, dims, strides, int dtype, int alignment, bint virtual):
        t = self._new(role, "TENSOR")
        t.set("TENSOR_DATA_TYPE", dtype)
        t.set("TENSOR_DIMENSIONS", list(dims))
        t.set("TENSOR_STRIDES", list(strides))
        t.set("TENSOR_UNIQUE_ID", UIDS[role])
        t.set("TENSOR_BYTE_ALIGNMENT", alignment)
        if virtual:
            t.set("TENSOR_IS_VIRTUAL", True)
        t.finalize()
        return t

    cdef Descriptor _pointwise(self, str role, int mode, Descriptor x, Descriptor b, Descriptor y):
        pw = self._new(role + ".mode", "POINTWISE")
        pw.set("POINTWISE_MODE", mode)
        pw.set("POINTWISE_MATH_PREC", DATA_FLOAT)
        pw.finalize()
        op = self._new(role, "OPERATION_POINTWISE")
        op.set("OPERATION_POINTWISE_PW_DESCRIPTOR", pw)
        op.set("OPERATION_POINTWISE_XDESC", x)
        if b is not None:
            op.set("OPERATION_POINTWISE_BDESC", b)
        op.set("OPERATION_POINTWISE_YDESC", y)
        op.finalize()
        return op

    cdef _build(self, Handle handle):
        s = self.spec
        ax, aw, ay, ab, am = s.alignments
        virtual = self.form == "virtual"
        o = s.y_dims[1]
        per_o = (1, o, 1, 1)
        per_o_strides = (o, 1, o, o)
        x = self._tensor("x", s.x_dims, s.x_strides, DATA_INT8, ax, False)
        w = self._tensor("w", s.w_dims, s.w_strides, DATA_INT8, aw, False)
        # The fp32 intermediates: virtual, or one dense NHWC scratch buffer.
        mid_strides = s.y_strides
        conv_out = self._tensor("conv", s.y_dims, mid_strides, DATA_FLOAT, 16, virtual)

        conv = self._new("conv.desc", "CONVOLUTION")
        conv.set("CONVOLUTION_COMP_TYPE", DATA_INT32)
        conv.set("CONVOLUTION_CONV_MODE", CROSS_CORRELATION)
        conv.set("CONVOLUTION_SPATIAL_DIMS", 2)
        conv.set("CONVOLUTION_FILTER_STRIDES", list(s.stride))
        conv.set("CONVOLUTION_DILATIONS", list(s.dilation))
        conv.set("CONVOLUTION_PRE_PADDINGS", list(s.pre_pad))
        conv.set("CONVOLUTION_POST_PADDINGS", list(s.post_pad))
        conv.finalize()
        conv_op = self._new("conv.op", "OPERATION_CONVOLUTION_FORWARD")
        conv_op.set("OPERATION_CONVOLUTION_FORWARD_CONV_DESC", conv)
        conv_op.set("OPERATION_CONVOLUTION_FORWARD_X", x)
        conv_op.set("OPERATION_CONVOLUTION_FORWARD_W", w)
        conv_op.set("OPERATION_CONVOLUTION_FORWARD_Y", conv_out)
        conv_op.set("OPERATION_CONVOLUTION_FORWARD_ALPHA", 1.0)
        conv_op.set("OPERATION_CONVOLUTION_FORWARD_BETA", 0.0)
        conv_op.finalize()
        ops = [conv_op]
        last = conv_out
        if s.bias:
            b = self._tensor("bias", per_o, per_o_strides, DATA_FLOAT, ab, False)
            add_out = self._tensor("add", s.y_dims, mid_strides, DATA_FLOAT, 16, virtual)
            ops.append(self._pointwise("add.op", POINTWISE_ADD, last, b, add_out))
            last = add_out
        if s.relu:
            relu_out = self._tensor("relu", s.y_dims, mid_strides, DATA_FLOAT, 16, virtual)
            ops.append(self._pointwise("relu.op", POINTWISE_RELU_FWD, last, None, relu_out))
            last = relu_out
        if s.per_channel:
            m = self._tensor("mult", per_o, per_o_strides, DATA_FLOAT, am, False)
        else:
            m = self._tensor("mult", (1, 1, 1, 1), (1, 1, 1, 1), DATA_FLOAT, am, False)
        y = self._tensor("y", s.y_dims, s.y_strides, DATA_INT8, ay, False)
        ops.append(self._pointwise("mul.op", POINTWISE_MUL, last, m, y))

        g = self._new("graph", "OPERATIONGRAPH")
        if handle is not None:
            g.set("OPERATIONGRAPH_HANDLE", handle.address)
        g.set("OPERATIONGRAPH_OPS", ops)
        g.finalize()
        self._graph = g

    @property
    def descriptors(self):
        """``[(role, kind, finalized)]`` for every descriptor, in build order."""
        return [(role, d.kind, d.finalized) for role, d in self.roles]

    @property
    def scratch_roles(self):
        """Roles bound to the fp32 scratch buffer in the in-place form."""
        if self.form == "virtual":
            return ()
        return ("conv",) + (("add",) if self.spec.bias else ()) + (("relu",) if self.spec.relu else ())

    def engine_configs(self, str mode):
        """Engine configs that heuristics ``mode`` ("A" or "FALLBACK") propose, best first.

        Needs a GPU and cuBLASLt (cuDNN aborts the process without them).
        """
        heur = Descriptor("ENGINEHEUR")
        try:
            heur.set("ENGINEHEUR_OPERATION_GRAPH", self._graph)
            heur.set("ENGINEHEUR_MODE", HEURISTIC_MODES[mode])
            heur.finalize()
            n = heur.count("ENGINEHEUR_RESULTS")
            return heur.get_descriptors("ENGINEHEUR_RESULTS", "ENGINECFG", n)
        except CudnnError as e:
            raise e.with_problem(f"{self.form} form, {self.spec.describe()}") from None
        finally:
            heur.destroy()


cdef class ExecutionPlan:
    """A finalized execution plan for one engine config of a :class:`QConvGraph`.

    Attributes
    ----------
    graph : QConvGraph
    workspace_size : int
        Bytes of device workspace each execution needs.
    engine : int
        The engine's global index.
    json : str
        cuDNN's description of the plan (engine and knobs).
    """

    cdef readonly QConvGraph graph
    cdef readonly Descriptor config
    cdef readonly Descriptor plan
    cdef readonly long long workspace_size
    cdef readonly long long engine
    cdef readonly str json

    def __init__(self, QConvGraph graph, Descriptor config, Handle handle):
        self.graph, self.config = graph, config
        plan = Descriptor("EXECUTION_PLAN")
        try:
            plan.set("EXECUTION_PLAN_HANDLE", handle.address)
            plan.set("EXECUTION_PLAN_ENGINE_CONFIG", config)
            plan.finalize()
            self.workspace_size = plan.get("EXECUTION_PLAN_WORKSPACE_SIZE")[0]
            self.json = plan.get("EXECUTION_PLAN_JSON_REPRESENTATION")
            eng = config.get_descriptors("ENGINECFG_ENGINE", "ENGINE", 1)[0]
            self.engine = eng.get("ENGINE_GLOBAL_INDEX")[0]
        except CudnnError as e:
            plan.destroy()
            raise e.with_problem(f"{graph.form} form, {graph.spec.describe()}") from None
        self.plan = plan

    def __dealloc__(self):
        if self.plan is not None:
            self.plan.destroy()

    def execute(self, Handle handle, dict pointers, workspace):
        """Run on ``handle``'s stream with device ``pointers`` by role (ints)."""
        roles = [r for r in UIDS if r in pointers]
        pack = Descriptor("VARIANT_PACK")
        try:
            pack.set("VARIANT_PACK_UNIQUE_IDS", [UIDS[r] for r in roles])
            pack.set("VARIANT_PACK_DATA_POINTERS", [pointers[r] for r in roles])
            pack.set("VARIANT_PACK_WORKSPACE", workspace)
            pack.finalize()
            execute(handle, self.plan, pack)
        except CudnnError as e:
            raise e.with_problem(f"{self.graph.form} form, engine {self.engine}, "
                                 f"{self.graph.spec.describe()}") from None
        finally:
            pack.destroy()
