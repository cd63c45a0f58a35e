"""An MLP end to end through PyTorch: Table 3 of ``benchmarks/woq_bench.py --torch``.

The MLP 4096-11008-4096-11008-4096 in bfloat16, ReLU between, no bias, at
batch 1 and 32, three ways: after ``qkern.torch.swap_linears``, through
``torch._weight_int8pack_mm`` per layer (the same int8 weights), and dense
``nn.Linear``; each with its time and output relative to the qkern path.
"""

from __future__ import annotations

import copy

from qkern import bench, roofline
from qkern.timing import time_call

MLP_WIDTHS = (4096, 11008, 4096, 11008, 4096)
MLP_BATCHES = (1, 32)
_MLP_WEIGHTS = sum(k * n for k, n in zip(MLP_WIDTHS, MLP_WIDTHS[1:]))  # int8 bytes

MLP_COLUMNS = [("path", "name", "{}"), ("batch", "M", "{}")] + bench.TIME_COLUMNS + [
    ("t / qkern", "ratio_vs_qkern", "{:.2f}"), ("max |y - y_qkern| / max |y_qkern|",
                                                 "rel_diff_vs_qkern", "{:.2g}")]


def _mlp_paths(torch) -> dict:
    """``{path name: model}`` for the bfloat16 MLP of widths ``MLP_WIDTHS``, ReLU between.

    The quantized paths share one set of int8 weights and scales
    (:func:`qkern.torch.quantize_per_channel` of the float weights).
    """
    import qkern.torch as qt

    torch.manual_seed(0)
    layers = []
    for k, n in zip(MLP_WIDTHS, MLP_WIDTHS[1:]):
        layers += [torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16), torch.nn.ReLU()]
    dense = torch.nn.Sequential(*layers[:-1])
    quantized = [qt.quantize_per_channel(m.weight, torch.bfloat16)
                 for m in dense if isinstance(m, torch.nn.Linear)]

    def torch_woq(x):
        for i, (q, s) in enumerate(quantized):
            x = torch._weight_int8pack_mm(x, q, s)
            x = torch.relu(x) if i < len(quantized) - 1 else x
        return x

    return {"qkern.torch.swap_linears": qt.swap_linears(copy.deepcopy(dense)),
            "torch._weight_int8pack_mm": torch_woq,
            "torch nn.Linear bf16 (dense)": dense}


def _mlp_title() -> str:
    """Title of the MLP table: the model, its weight bytes and this machine's last-level cache."""
    weights = _MLP_WEIGHTS / 2**20
    cache = f"; last-level cache {roofline.last_level_cache_bytes() / 2**20:.0f} MiB"
    return (f"Table 3 - MLP {'-'.join(map(str, MLP_WIDTHS))}, ReLU between, bfloat16, end to end "
            f"through PyTorch (t / qkern: median over swap_linears')\nweights {weights:.0f} MiB "
            f"in int8, {2 * weights:.0f} MiB in bfloat16{cache}")


def mlp_table(threads: int, torch) -> list:
    """Time the MLP of ``MLP_WIDTHS`` (bfloat16, no bias) through three paths.

    The paths: the model after :func:`qkern.torch.swap_linears`, PyTorch's
    own WoQ path (``torch._weight_int8pack_mm`` per layer, same int8 weights)
    and the dense bfloat16 model. The weights total 172 MiB in int8 (344 MiB
    in bfloat16); where the last-level cache holds them, the figures are
    partly cache-resident.

    Parameters
    ----------
    threads : int
        Set in torch by the caller (``torch.set_num_threads``); the qkern
        custom ops use ``torch.get_num_threads()``.
    torch : module
        PyTorch.

    Returns
    -------
    list of dict
        One row per (batch, path); GFLOP/s and weight GB/s count every layer
        (``2 * M * sum(N*K)`` and ``sum(N*K)`` int8 bytes), ``ratio_vs_qkern``
        is the path's median over the qkern path's, and ``rel_diff_vs_qkern``
        the largest difference of its output from qkern's, relative to the
        largest output.
    """
    paths = _mlp_paths(torch)
    rows = []
    with torch.inference_mode():
        for m in MLP_BATCHES:
            x = torch.randn(m, MLP_WIDTHS[0]).to(torch.bfloat16)
            for name, model in paths.items():
                t = time_call(lambda: model(x))
                y = model(x).float()
                if name == "qkern.torch.swap_linears":  # the first path
                    ours, y_ours = t.median, y
                row = bench.result_row(
                    "torch_mlp", name, "bfloat16", m, MLP_WIDTHS[-1], MLP_WIDTHS[0], t,
                    _MLP_WEIGHTS, threads=threads, widths=list(MLP_WIDTHS),
                    ratio_vs_qkern=t.median / ours,
                    rel_diff_vs_qkern=float((y - y_ours).abs().max() / y_ours.abs().max()))
                row.update(gflops=2.0 * m * _MLP_WEIGHTS / t.median / 1e9)
                rows.append(row)
    return rows


def report(threads: int, torch) -> list:
    """Time and print :func:`mlp_table`.

    Parameters
    ----------
    threads : int
        The thread count torch was set to.
    torch : module
        PyTorch.

    Returns
    -------
    list of dict
        Its rows.
    """
    rows = mlp_table(threads, torch)
    bench.print_table(_mlp_title(), MLP_COLUMNS, rows)
    return rows
