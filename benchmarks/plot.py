"""The figure of ``benchmarks/woq_bench.py --plot``: % of roofline and each
peer's time over qkern's, against M (needs matplotlib)."""

from __future__ import annotations


def draw(rows: list, path: str) -> None:
    """Draw % of roofline and speedup over each peer against M, one column per shape.

    Parameters
    ----------
    rows : list of dict
        Rows of the benchmark; those of the peers table (``"table": "peers"``)
        on shapes timed at more than one M are drawn.
    path : str
        The PNG file written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    peers = [r for r in rows if r["table"] == "peers"]
    shapes = sorted({(r["N"], r["K"]) for r in peers if len({q["M"] for q in peers
                     if (q["N"], q["K"]) == (r["N"], r["K"])}) > 1})
    fig, axes = plt.subplots(2, len(shapes), figsize=(5 * len(shapes), 8), squeeze=False)
    for col, (n, k) in enumerate(shapes):
        sel = [r for r in peers if (r["N"], r["K"]) == (n, k)]
        for thr in sorted({r["threads"] for r in sel}):
            for name in sorted({r["name"] for r in sel}):
                pts = sorted((r["M"], r) for r in sel if r["name"] == name and r["threads"] == thr)
                ms = [m for m, _ in pts]
                if name.startswith("qkern "):
                    axes[0][col].plot(ms, [r["pct_roofline"] for _, r in pts], marker="o",
                                      label=f"{name}, {thr} thr")
                elif pts:
                    axes[1][col].plot(ms, [r["ratio_vs_qkern"] for _, r in pts], marker="o",
                                      label=f"{name}, {thr} thr")
        for ax, ylabel in ((axes[0][col], "% of roofline"),
                           (axes[1][col], "peer time / qkern bf16 time")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("M")
            ax.set_ylabel(ylabel)
            ax.set_title(f"N={n}, K={k}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=6)
        axes[1][col].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
