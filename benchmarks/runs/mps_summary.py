"""JSON + plot of the AG+GEMM schedules at world 2 under MPS (benchmarks/results/h200-1gpu-mps/ag_gemm_w2_schedules):
read from the logs of `benchmarks/runs/mps_claims.py` (claims on, `--claim off`) and `mps_timelines.sh` (tilec taxes
--measure --timeline, before claims existed). Run: python benchmarks/runs/mps_summary.py"""

import json
import re
import sys
from pathlib import Path

DIR = Path(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results/h200-1gpu-mps/ag_gemm_w2_schedules")
LABEL = "one GPU split by MPS, links through HBM"


def times(log: str, pattern: str) -> dict[str, float]:
    return {m[1]: float(m[2]) for m in re.finditer(pattern, (DIR / log).read_text(), re.M)}


def main() -> None:
    claims = times("claims.log", r"^(\S+)\s+(\d+) us")
    static = times("static.log", r"^(\S+)\s+(\d+) us")
    taxes = times("taxes_timeline_static.log", r"^(bsp|flags|fused-pull|fused-push|specialized)\s+\S+ us.*?(\d+) us$")
    bsp = claims["bsp"]
    rows = []
    for s in ("bsp", "flags", "fused-pull", "fused-push", "specialized"):
        r = {"schedule": s, "world": 2, "shape": {"M": 8192, "N": 4608, "K": 36864}, "dtype": "f16",
             "config": {"BM": 128, "BN": 256, "BK": 64, "num_warps": 8, "num_stages": 3, "group_m": 8},
             "static_us": static.get(s), "claims_us": claims.get(s), "taxes_run_static_us": taxes.get(s),
             "note": LABEL}
        best = r["claims_us"] or r["static_us"] or r["taxes_run_static_us"]
        r["vs_tilec_bsp"] = round(bsp / best, 3)
        rows.append(r)
    meta = {"gpu": "NVIDIA H200 (one GPU, 132 SMs), MPS at 50% per rank: 66 SMs each", "gpu_sharing": "mps",
            "timing": "tilec.perf.taxes.measure_times: median of 20 calls (3 warm-up), entry barrier included, CUDA "
                      "events, the slowest rank", "label": LABEL,
            "claims_us / static_us": "benchmarks/runs/mps_claims.py in one session, persistent loops claiming their "
                                     "tasks (the default under MPS) vs --claim off (the static stride)",
            "taxes_run_static_us": "tilec taxes --measure in an earlier call of the session (static stride)",
            "commands": ["sh benchmarks/runs/mps_world.sh --spawn 2 python3 benchmarks/runs/mps_claims.py",
                         "sh benchmarks/runs/mps_world.sh --spawn 2 python3 benchmarks/runs/mps_claims.py "
                         "--claim off",
                         "sh benchmarks/runs/mps_timelines.sh OUT_DIR"]}
    (DIR / "ag_gemm_w2_mps.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    names = [r["schedule"] for r in rows]
    for i, (key, lab) in enumerate((("taxes_run_static_us", "static stride (taxes run)"),
                                    ("static_us", "static stride (--claim off)"), ("claims_us", "claimed tasks"))):
        xs = [j + 0.27 * (i - 1) for j, r in enumerate(rows) if r[key]]
        ax.bar(xs, [r[key] / 1e3 for r in rows if r[key]], 0.25, label=lab)
    ax.axhline(7.5, color="black", linestyle="--", linewidth=1,
               label="two torch.matmul side by side, same per-rank work (7.4-7.7 ms, an earlier run)")
    ax.set_xticks(range(len(rows)), names)
    ax.set_ylabel("ms per call (slowest rank)")
    ax.set_title(f"AG+GEMM 8192x4608x36864, world 2 on one H200 ({LABEL})", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(DIR / "ag_gemm_w2_mps.png", dpi=110)


if __name__ == "__main__":
    main()
