"""The fused int8 conv2d on CUDA arrays: argument checks, padding, plans, execution.

Calls only down: the problem spec shared with the CPU path
(:mod:`qkern._conv_spec`), device memory (:mod:`._device`), the plan cache
(:mod:`._plancache`) and the Cython tiers (:mod:`._graph`, :mod:`._backend`).
"""

from __future__ import annotations

import statistics
import threading

import numpy as np

from qkern._conv_spec import ConvGeometry, epilogue_constants, geometry
from qkern.cudnn import _device, _loader
from qkern.cudnn._errors import CudnnError
from qkern.cudnn._plancache import plan_cache
from qkern.cudnn._spec import GraphSpec, nhwc_strides, round_up

__all__ = ["CHANNEL_MULTIPLE", "QConv2d", "Staging", "check_out", "choose_plan", "graph_spec",
           "pad_channels", "pad_weight", "plan_key", "qconv2d", "staging"]

# cuDNN's int8 convolutions read channels in vectors of four.
CHANNEL_MULTIPLE = 4
# Pointers less aligned than this are staged through a fresh buffer.
MIN_ALIGNMENT = 4
AUTOTUNE_RUNS = 5

_handles = threading.local()


def _handle(device: int):
    from qkern.cudnn._backend import Handle

    per_thread = getattr(_handles, "by_device", None)
    if per_thread is None:
        per_thread = _handles.by_device = {}
    if device not in per_thread:
        per_thread[device] = Handle(device)
    return per_thread[device]


class Staging:
    """Whether x and y go through padded/aligned buffers, and their layouts.

    Attributes
    ----------
    x : bool
        x is copied into a dense buffer of ``cgp`` channels per group
        (channels need padding, x is not dense, or its pointer is
        misaligned).
    y : bool
        The graph writes a padded buffer that is then copied to ``out``.
    pitch : int
        Elements between pixels of the caller's x.
    """

    def __init__(self, x: bool, y: bool, pitch: int):
        self.x, self.y, self.pitch = x, y, pitch

    def __repr__(self):
        return f"Staging(x={self.x}, y={self.y}, pitch={self.pitch})"


def staging(x: _device.ArraySpec, out_ptr: int, cg: int, og: int) -> Staging:
    """Decide the copies a call needs (pure function of the layouts)."""
    pitch = _device.pixel_pitch("x", x)
    c = x.shape[3]
    stage_x = (round_up(cg, CHANNEL_MULTIPLE) != cg or pitch != c
               or _device.alignment(x.ptr) < MIN_ALIGNMENT)
    stage_y = round_up(og, CHANNEL_MULTIPLE) != og or _device.alignment(out_ptr) < MIN_ALIGNMENT
    return Staging(stage_x, stage_y, pitch)


def pad_weight(w: np.ndarray, groups: int) -> np.ndarray:
    """OHWI int8 weight with C/groups and O/groups zero-padded to :data:`CHANNEL_MULTIPLE`."""
    o, kh, kw, cg = w.shape
    og = o // groups
    cgp, ogp = round_up(cg, CHANNEL_MULTIPLE), round_up(og, CHANNEL_MULTIPLE)
    out = np.zeros((groups, ogp, kh, kw, cgp), dtype=np.int8)
    out[:, :og, :, :, :cg] = w.reshape(groups, og, kh, kw, cg)
    return out.reshape(groups * ogp, kh, kw, cgp)


def pad_channels(v: np.ndarray, groups: int) -> np.ndarray:
    """A per-output-channel vector with O/groups zero-padded to :data:`CHANNEL_MULTIPLE`."""
    og = v.shape[0] // groups
    out = np.zeros((groups, round_up(og, CHANNEL_MULTIPLE)), dtype=v.dtype)
    out[:, :og] = v.reshape(groups, og)
    return out.ravel()


def plan_key(spec: GraphSpec, autotune: bool, cudnn_version: int) -> tuple:
    """The plan-cache key: the spec (shapes, strides, parameters, alignments, device),
    autotune, cuDNN."""
    return (spec, bool(autotune), int(cudnn_version))


def graph_spec(g: ConvGeometry, *, bias: bool, relu: bool, per_channel: bool,
               alignments: tuple = (16,) * 5, device: int = 0) -> GraphSpec:
    """The cuDNN graph of geometry ``g``, channels padded per group to :data:`CHANNEL_MULTIPLE`."""
    cgp, ogp = round_up(g.cg, CHANNEL_MULTIPLE), round_up(g.og, CHANNEL_MULTIPLE)
    cp, op = g.groups * cgp, g.groups * ogp
    return GraphSpec(
        x_dims=(g.n, cp, g.h, g.w), w_dims=(op, cgp, g.kh, g.kw), y_dims=(g.n, op, g.oh, g.ow),
        x_strides=nhwc_strides(g.n, cp, g.h, g.w), w_strides=nhwc_strides(op, cgp, g.kh, g.kw),
        y_strides=nhwc_strides(g.n, op, g.oh, g.ow), stride=g.stride, dilation=g.dilation,
        pre_pad=(g.pad_h[0], g.pad_w[0]), post_pad=(g.pad_h[1], g.pad_w[1]), bias=bias, relu=relu,
        per_channel=per_channel, alignments=tuple(alignments), device=device)


def _check_int8_device(name: str, a: _device.ArraySpec, ndim: int, device: int | None = None):
    if a.dtype != np.int8:
        raise TypeError(f"{name}: expected dtype int8, got {a.dtype}")
    if len(a.shape) != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {a.shape}")
    if a.device < 0:
        raise ValueError(f"{name}: expected CUDA device memory, got host memory "
                         "(NumPy input runs on the CPU: pass NumPy arrays for x and w)")
    if device is not None and a.device != device:
        raise ValueError(f"{name}: on CUDA device {a.device}, but x is on device {device}")


def check_out(out: _device.ArraySpec, shape: tuple, device: int, inputs: dict) -> None:
    """``out`` must be a dense int8 array of ``shape`` on ``device`` not overlapping ``inputs``."""
    _check_int8_device("out", out, 4, device)
    if out.shape != shape:
        raise ValueError(f"out: expected shape {shape}, got {out.shape}")
    if not out.dense:
        raise ValueError(f"out: expected a dense NHWC array, got element strides {out.strides}")
    lo, hi = out.span()
    for name, a in inputs.items():
        a_lo, a_hi = a.span()
        if lo < a_hi and a_lo < hi:
            raise ValueError(f"out: overlaps {name}")


def _timed(plan, run, stream) -> float:
    from cuda.core import EventOptions

    opts = EventOptions(enable_timing=True)
    run(plan)
    times = []
    for _ in range(AUTOTUNE_RUNS):
        start = stream.record(options=opts)
        run(plan)
        end = stream.record(options=opts)
        end.sync()
        times.append(end - start)
    return statistics.median(times)


def choose_plan(spec: GraphSpec, handle, *, autotune: bool, run=None, stream=None):
    """The execution plan for ``spec``: virtual form first, then the in-place form.

    In each form, heuristics mode A, then FALLBACK, propose engine configs;
    the first that finalizes wins, or with ``autotune`` every one that
    finalizes is timed (``run(plan)`` on ``stream``) and the fastest wins.

    Raises
    ------
    CudnnError
        No engine config of either form finalizes; the last error is chained.
    """
    from qkern.cudnn._graph import ExecutionPlan, QConvGraph

    errors = []
    for form in ("virtual", "inplace"):
        try:
            graph = QConvGraph(spec, form, handle)
        except CudnnError as e:
            errors.append(e)
            continue
        plans = []
        for mode in ("A", "FALLBACK"):
            try:
                configs = graph.engine_configs(mode)
            except CudnnError as e:
                errors.append(e)
                continue
            for cfg in configs:
                try:
                    plan = ExecutionPlan(graph, cfg, handle)
                except CudnnError as e:
                    errors.append(e)
                    continue
                if not autotune:
                    return plan
                plans.append(plan)
        if plans:
            return min(plans, key=lambda p: _timed(p, run, stream))
    last = errors[-1] if errors else None
    raise CudnnError(3000,
                     "choose an engine (heuristics A and FALLBACK, virtual and in-place forms)",
                     f"no engine config finalized; {len(errors)} attempts failed, last: {last}",
                     spec.describe()) from last


class QConv2d:
    """A quantized conv2d layer on the GPU: weights on the device, bias folded, plans cached.

    Computes exactly what :func:`qkern.qconv2d` computes (same arguments,
    same fp32 constants), holding the padded int8 weights, the pre-scaled
    bias ``bias / (act_scale * weight_scale)`` and the requantize multiplier
    in device memory.  Plans live in the process-wide cache
    (:func:`plan_cache_info`) and are shared by layers of equal shapes.

    Parameters
    ----------
    w : numpy.ndarray or CUDA array
        int8 OHWI ``(O, kh, kw, C/groups)``; copied (and padded) to the device once.
    bias, act_scale, weight_scale, out_scale, stride, padding, dilation, groups, relu
        As in :func:`qkern.qconv2d`.
    device : int, optional
        CUDA device; default: the device of ``w`` when it is a CUDA array, else 0.
    autotune : bool
        Time every engine config that finalizes and keep the fastest
        (the first call on each new shape pays for it).

    Attributes
    ----------
    last_plan : dict or None
        ``{"engine", "form", "workspace", "json"}`` of the plan the last call ran.
    """

    def __init__(self, w, bias=None, *, act_scale, weight_scale, out_scale, stride=1, padding=0,
                 dilation=1, groups=1, relu=False, device=None, autotune=False):
        if isinstance(w, np.ndarray):
            w_host = w
            w_dev = None
        else:
            w_dev = _device.describe("w", w, None)
            _check_int8_device("w", w_dev, 4)
            w_host = None
        shape = (w_host if w_host is not None else w_dev).shape
        if w_host is not None and w_host.dtype != np.int8:
            raise TypeError(f"w: expected dtype int8, got {w_host.dtype}")
        if len(shape) != 4:
            raise ValueError(f"w: expected shape (O, kh, kw, C/groups), got {tuple(shape)}")
        o, kh, kw, cg = shape
        # Validate stride/padding/dilation/groups now, against an input large enough for any kernel.
        self._params = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
        g = geometry((1, 1 << 20, 1 << 20, cg * groups), shape, **self._params)
        self.epilogue = epilogue_constants(o, bias, act_scale=act_scale, weight_scale=weight_scale,
                                           out_scale=out_scale, relu=relu)
        self.w_shape = tuple(shape)
        self.groups, self.cg, self.og = g.groups, g.cg, g.og
        self.cgp, self.ogp = round_up(g.cg, CHANNEL_MULTIPLE), round_up(g.og, CHANNEL_MULTIPLE)
        self.device = (w_dev.device if w_dev is not None else 0) if device is None else int(device)
        self.autotune = bool(autotune)
        self.last_plan = None
        dev = _device.require_device(self.device)
        _loader.ensure_loaded()
        stream = dev.default_stream
        if w_dev is not None and not w_dev.dense:
            raise ValueError(f"w: expected a dense OHWI array, got element strides {w_dev.strides}")
        if w_dev is not None and (self.cgp != self.cg or self.ogp != self.og
                                  or _device.alignment(w_dev.ptr) < MIN_ALIGNMENT):
            w_host = _device.download(w_dev, stream)      # padded on the host, uploaded once
        self._buffers = {}
        if w_host is not None:
            self._buffers["w"] = self._upload(dev, stream, pad_weight(w_host, self.groups))
            self._w_ptr = _device.buffer_ptr(self._buffers["w"])
        else:
            self._w_keep = w                # the caller's device weights, used in place
            self._w_ptr = w_dev.ptr
        ep = self.epilogue
        if ep.bias is not None:
            self._buffers["bias"] = self._upload(dev, stream, pad_channels(ep.bias, self.groups))
        mult = pad_channels(ep.multiplier, self.groups) if ep.per_channel else ep.multiplier
        self._buffers["mult"] = self._upload(dev, stream, mult)

    @staticmethod
    def _upload(dev, stream, host: np.ndarray):
        buf = _device.allocate(dev, host.nbytes, stream)
        _device.upload(host, _device.buffer_ptr(buf), stream)
        return buf

    def spec(self, x_shape: tuple, alignments: tuple) -> GraphSpec:
        """The :class:`GraphSpec` (and plan-cache key) of a call with ``x`` of ``x_shape``."""
        ep = self.epilogue
        return graph_spec(geometry(x_shape, self.w_shape, **self._params), bias=ep.bias is not None,
                          relu=ep.relu, per_channel=ep.per_channel, alignments=alignments,
                          device=self.device)

    def __call__(self, x, *, out=None, stream=None):
        """Run on a CUDA array ``x`` (int8 NHWC); returns ``out`` or a new :class:`DeviceArray`.

        ``out`` and ``stream`` are as in :func:`qkern.qconv2d`.
        """
        from qkern.cudnn._api import version

        dev = _device.require_device(self.device)
        strm = _device.resolve_stream(stream, dev)
        sh = _device.stream_handle(strm)
        xs = _device.describe("x", x, sh)
        _check_int8_device("x", xs, 4, self.device)
        g = geometry(xs.shape, self.w_shape, **self._params)
        if out is None:
            result = _device.DeviceArray(_device.allocate(dev, int(np.prod(g.out_shape)), strm),
                                         g.out_shape, self.device, strm)
            out_spec = result.spec()
        else:
            result, out_spec = out, _device.describe("out", out, sh)
            check_out(out_spec, g.out_shape, self.device, {"x": xs})
        st = staging(xs, out_spec.ptr, self.cg, self.og)
        if g.n == 0:
            return result
        temps = []

        def scratch(nbytes):
            buf = _device.allocate(dev, nbytes, strm)
            temps.append(buf)
            return _device.buffer_ptr(buf)

        pixels_in, pixels_out = g.n * g.h * g.w, g.n * g.oh * g.ow
        cp, op = self.groups * self.cgp, self.groups * self.ogp
        pointers = {"x": scratch(pixels_in * cp) if st.x else xs.ptr, "w": self._w_ptr,
                    "y": scratch(pixels_out * op) if st.y else out_spec.ptr,
                    "mult": _device.buffer_ptr(self._buffers["mult"])}
        if "bias" in self._buffers:
            pointers["bias"] = _device.buffer_ptr(self._buffers["bias"])
        if st.x:
            self._stage_x(pointers["x"], xs, st.pitch, pixels_in, strm)
        spec = self.spec(xs.shape, tuple(_device.alignment(pointers.get(r, 0))
                                         for r in ("x", "w", "y", "bias", "mult")))
        handle = _handle(self.device)
        handle.set_stream(sh)

        fp32 = []          # the in-place form's one fp32 buffer, allocated if a plan needs it

        def run(plan):
            ptrs = dict(pointers)
            if plan.graph.scratch_roles:
                if not fp32:
                    fp32.append(scratch(pixels_out * op * 4))
                ptrs.update(dict.fromkeys(plan.graph.scratch_roles, fp32[0]))
            ws = _device.allocate(dev, plan.workspace_size, strm)
            plan.execute(handle, ptrs, _device.buffer_ptr(ws))
            ws.close(strm)

        plan = plan_cache.get(plan_key(spec, self.autotune, version()),
                              lambda: choose_plan(spec, handle, autotune=self.autotune, run=run,
                                                  stream=strm))
        run(plan)
        self.last_plan = {"engine": plan.engine, "form": plan.graph.form,
                          "workspace": plan.workspace_size, "json": plan.json}
        if st.y:
            # Padded groups -> dense output: one 2-D copy of pixels * groups rows.
            _device.copy_rows(out_spec.ptr, self.og, pointers["y"], self.ogp, self.og,
                              pixels_out * self.groups, strm)
        for buf in temps:
            buf.close(strm)
        return result

    def _stage_x(self, dst: int, xs, pitch: int, pixels: int, strm) -> None:
        """Copy x into a dense buffer with ``cgp`` channels per group (zeros in the padding)."""
        cg, cgp, gcount = self.cg, self.cgp, self.groups
        if cgp != cg:
            _device.memset_zero(dst, pixels * gcount * cgp, strm)
        if pitch == xs.shape[3]:
            # Dense x: every (pixel, group) is a row of cg bytes.
            _device.copy_rows(dst, cgp, xs.ptr, cg, cg, pixels * gcount, strm)
        else:
            for i in range(gcount):
                _device.copy_rows(dst + i * cgp, gcount * cgp, xs.ptr + i * cg, pitch, cg, pixels,
                                  strm)


def qconv2d(x, w, bias=None, *, act_scale, weight_scale, out_scale, stride=1, padding=0,
            dilation=1, groups=1, relu=False, out=None, stream=None):
    """:func:`qkern.qconv2d` for a CUDA array ``x`` (a one-call :class:`QConv2d`)."""
    _device.require_cuda()
    xs = _device.describe("x", x, -1)
    _check_int8_device("x", xs, 4)
    layer = QConv2d(w, bias, act_scale=act_scale, weight_scale=weight_scale, out_scale=out_scale,
                    stride=stride, padding=padding, dilation=dilation, groups=groups, relu=relu,
                    device=xs.device)
    return layer(x, out=out, stream=stream)
