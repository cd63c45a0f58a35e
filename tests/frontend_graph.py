"""The qconv graph built a second, independent way: NVIDIA's cudnn-frontend
Python API (``pip install nvidia-cudnn-frontend``, module ``cudnn``), on
PyTorch tensors.  Used by the GPU tests (bit-for-bit cross-check) and by
benchmarks/gpu_check.py (timing).  Needs a GPU.
"""

from __future__ import annotations


def build(torch, x, w, bias_scaled, mult, *, stride, padding, dilation, relu):
    """A callable running the frontend graph on int8 NHWC torch tensors.

    ``x``: (N, H, W, C) int8; ``w``: (O, kh, kw, Cg) int8; ``bias_scaled``:
    (O,) float32 or None (already divided by act_scale * weight_scale);
    ``mult``: (1,) or (O,) float32.  C/groups and O/groups must already be
    multiples of 4.  ``padding`` is ((top, bottom), (left, right)).
    Returns ``run() -> y`` with y an (N, OH, OW, O) int8 tensor.
    """
    import cudnn

    n, h, wd, c = x.shape
    o, kh, kw, cg = w.shape
    (pt, pb), (pl, pr) = padding
    oh = (h + pt + pb - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pl + pr - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    g = cudnn.pygraph(io_data_type=cudnn.data_type.INT8,
                      intermediate_data_type=cudnn.data_type.FLOAT,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    tx = g.tensor(name="x", dim=[n, c, h, wd], stride=[h * wd * c, 1, wd * c, c],
                  data_type=cudnn.data_type.INT8)
    tw = g.tensor(name="w", dim=[o, cg, kh, kw], stride=[kh * kw * cg, 1, kw * cg, cg],
                  data_type=cudnn.data_type.INT8)
    v = g.conv_fprop(image=tx, weight=tw, pre_padding=[pt, pl], post_padding=[pb, pr],
                     stride=list(stride), dilation=list(dilation),
                     compute_data_type=cudnn.data_type.INT32)
    v.set_data_type(cudnn.data_type.FLOAT)
    pack = {tx: x, tw: w}
    if bias_scaled is not None:
        tb = g.tensor(name="b", dim=[1, o, 1, 1], stride=[o, 1, o, o],
                      data_type=cudnn.data_type.FLOAT)
        v = g.add(a=v, b=tb, compute_data_type=cudnn.data_type.FLOAT)
        pack[tb] = bias_scaled
    if relu:
        v = g.relu(input=v, compute_data_type=cudnn.data_type.FLOAT)
    mo = mult.numel()
    tm = g.tensor(name="m", dim=[1, mo, 1, 1], stride=[mo, 1, mo, mo],
                  data_type=cudnn.data_type.FLOAT)
    pack[tm] = mult
    ty = g.mul(a=v, b=tm, compute_data_type=cudnn.data_type.FLOAT)
    ty.set_output(True).set_data_type(cudnn.data_type.INT8)
    ty.set_dim([n, o, oh, ow]).set_stride([oh * ow * o, 1, ow * o, o])
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    y = torch.empty((n, oh, ow, o), dtype=torch.int8, device=x.device)
    pack[ty] = y
    workspace = torch.empty(max(1, g.get_workspace_size()), dtype=torch.uint8, device=x.device)

    def run():
        g.execute(pack, workspace, handle=handle)
        return y

    return run
