"""The table and plot of mps_fused.py's runs over the paper shapes: per (program, world, shape), tilec bsp (host and
device barriers), the fused schedules, auto's pick and the concurrent plain torch.matmul of the same per-rank work,
with auto's pick over bsp and over the matmul against the targets (>= 1.1x bsp, <= 1.25x matmul) and the cost
model's error on the rows it ranks.

  python benchmarks/runs/mps_paper_summary.py DIR   # reads DIR/{ag_gemm,gemm_rs}_w*_M_N_K.json (mps_fused.py's,
                                                    # one a shape or --shapes); writes DIR/summary.md,
                                                    # DIR/summary.json and DIR/auto_vs_bsp.png
"""

import json
import sys
from pathlib import Path

SCHEDULES = ("bsp", "fused-pull", "fused-push")


def case_row(res: dict) -> dict:
    rows = {r["name"]: r for r in res["rows"]}
    pick = res["meta"]["auto_pick"]
    auto = rows.get(f"auto: {pick}", rows.get(pick))
    d = res["meta"]["dims"]
    devbar = rows.get("bsp (device barriers, graph)", {}).get("device_us")  # None: a run with --skip devbar
    model_err = {n: round(r["predicted_us"] / r["device_us"] - 1, 3) for n, r in rows.items()
                 if r.get("predicted_us") and (n in SCHEDULES or n.startswith("auto:"))}
    return {"program": Path(res["meta"]["program"]).stem, "world": res["meta"]["world"],
            "shape": f"{d['M']}x{d['N']}x{d['K']}", "auto_pick": pick,
            "matmul_us": rows["matmul"]["device_us"], "bsp_us": rows["bsp"]["device_us"],
            "bsp_device_barriers_us": devbar,
            "fused_pull_us": rows.get("fused-pull", {}).get("device_us"),
            "fused_push_us": rows["fused-push"]["device_us"], "auto_us": auto["device_us"],
            "best_tilec": min((n for n in rows if n in SCHEDULES or n.startswith("auto:")),
                              key=lambda n: rows[n]["device_us"]),
            "auto_vs_bsp": round(rows["bsp"]["device_us"] / auto["device_us"], 3),
            "auto_vs_bsp_device_barriers": round(devbar / auto["device_us"], 3) if devbar else None,
            "auto_over_matmul": round(auto["device_us"] / rows["matmul"]["device_us"], 3), "model_err": model_err}


def table(rows: list[dict]) -> str:
    out = ["| program | world | shape | matmul us | bsp | bsp, device barriers | fused-pull | fused-push | auto picks "
           "| auto | auto / bsp (>= 1.1) | auto / matmul (<= 1.25) | model error, auto's row |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        err = r["model_err"].get(f"auto: {r['auto_pick']}", r["model_err"].get(r["auto_pick"]))
        pull = f"{r['fused_pull_us']:.0f}" if r["fused_pull_us"] else "-"
        ok1 = "" if r["auto_vs_bsp"] >= 1.1 else " (miss)"
        ok2 = "" if r["auto_over_matmul"] <= 1.25 else " (miss)"
        out.append(f"| {r['program']} | {r['world']} | {r['shape']} | {r['matmul_us']:.0f} | {r['bsp_us']:.0f} "
                   f"| {r['bsp_device_barriers_us'] or 0:.0f} | {pull} | {r['fused_push_us']:.0f} "
                   f"| {r['auto_pick']} | {r['auto_us']:.0f} | {r['auto_vs_bsp']:.3f}x{ok1} "
                   f"| {r['auto_over_matmul']:.3f}x{ok2} | {err:+.1%} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    d = Path(sys.argv[1])
    rows = [case_row(json.loads(p.read_text())) for p in sorted(d.glob("*_w*_*_*_*.json"))]
    rows.sort(key=lambda r: (r["program"], r["world"], [int(x) for x in r["shape"].split("x")]))
    (d / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    (d / "summary.md").write_text(table(rows))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 4.5))
    labels = [f"{r['program']} w{r['world']}\n{r['shape']}" for r in rows]
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["auto_vs_bsp"] for r in rows], 0.4, label="auto's pick over tilec bsp")
    ax.bar([x + 0.2 for x in xs], [r["matmul_us"] / r["auto_us"] for r in rows], 0.4,
           label="concurrent matmul over auto's pick")
    ax.axhline(1.1, color="k", ls="--", lw=0.8, label="1.1x bsp target")
    ax.axhline(0.8, color="r", ls=":", lw=0.8, label="auto within 1.25x matmul (0.8)")
    ax.set_xticks(list(xs), labels, fontsize=6, rotation=60)
    ax.set_ylabel("speed-up (higher is better)")
    ax.set_title("One H200 split by MPS (links through HBM): auto against tilec bsp and the concurrent matmul")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(d / "auto_vs_bsp.png", dpi=120)
