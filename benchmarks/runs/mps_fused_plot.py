"""The plot of mps_fused.py's results: per case (program, world), every row's device time over the concurrent plain
torch.matmul of the same per-rank work (1.0), with the target's 1.25x line.

  python benchmarks/runs/mps_fused_plot.py DIR [FILE.json ...]   # writes DIR/fused_vs_bsp.png

A case per file (one program, world and shape: {ag_gemm,gemm_rs}_w{2,4}.json of one shape, or the
<program>_w<W>_<M>_<N>_<K>.json of `--shapes`), in name order: the FILEs named, else every mps_fused.py result in DIR
but the runs of the code before a change that fused_vs_bsp/ keeps for their A/Bs (EARLIER). Rows without a time (a
failed row) are left out.
"""

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

EARLIER = ("ag_gemm_w4_run1.json", "gemm_rs_w4_owners_in_rank_order.json")

if __name__ == "__main__":
    d = Path(sys.argv[1])
    cases = []
    files = [d / f for f in sys.argv[2:]] or [f for f in sorted(d.glob("*.json")) if f.name not in EARLIER]
    for f in files:
        res = json.loads(f.read_text())
        if not isinstance(res, dict):  # e.g. a summary's list
            continue
        mm = [r for r in res.get("rows", []) if r.get("name") == "matmul" and r.get("device_us")]
        if "dims" in res.get("meta", {}) and mm:  # an mps_fused.py result with its matmul row
            res["rows"] = [r for r in res["rows"] if r.get("device_us") and r.get("vs_matmul")]
            cases.append((f.name, res))
    names = []
    for _f, res in cases:
        names += [r["name"] for r in res["rows"] if r["name"] != "matmul" and r["name"] not in names]
    fig, ax = plt.subplots(figsize=(max(12, 3 * len(cases)), 5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        xs, ys = [], []
        for j, (_f, res) in enumerate(cases):
            row = next((r for r in res["rows"] if r["name"] == name), None)
            if row is not None:
                xs.append(j + (i - len(names) / 2 + 0.5) * width)
                ys.append(row["vs_matmul"])
        bars = ax.bar(xs, ys, width, label=name)
        for b, y in zip(bars, ys, strict=True):
            ax.text(b.get_x() + b.get_width() / 2, y + 0.01, f"{y:.2f}", ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.25, color="r", lw=0.8, ls="--", label="1.25x matmul (target)")
    labels = []
    for _f, res in cases:
        m = res["meta"]
        mm = next(r["device_us"] for r in res["rows"] if r["name"] == "matmul")
        shape = "x".join(str(m["dims"][k]) for k in ("M", "N", "K"))
        labels.append(f"{Path(m['program']).stem} world {m['world']}\n{shape}\n"
                      f"(matmul {mm / 1e3:.2f} ms; auto: {m['auto_pick']})")
    ax.set_xticks(range(len(cases)), labels, fontsize=7 if len(cases) > 4 else None)
    ax.set_ylabel("device time / concurrent torch.matmul of the per-rank work")
    ax.set_title("One H200 split by MPS (links through HBM), f16, tilec bench's first Hopper config per shape")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.3)
    ax.legend(fontsize=8, ncol=4, loc="upper left")
    fig.tight_layout()
    fig.savefig(d / "fused_vs_bsp.png", dpi=110)
    print(f"wrote {d / 'fused_vs_bsp.png'}")
