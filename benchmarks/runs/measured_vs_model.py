"""The cost model's predictions of docs/SCALE.md's shape checked against what was timed here: world 1 on one H200
(`tilec bench --shapes paper`, benchmarks/results/h200-1gpu/*_paper_bf16.json, Iris) and both backends side by side
at worlds 2 and 4 under MPS (`tilec bench --backend iris,nvshmem`, benchmarks/results/h200-1gpu-mps/backends/*.json).
Every tilec row is predicted at the tile config it ran with (tilec.perf.taxes on the H200, or on
tilec.perf.model.mps_rank of the SMs a rank reported; entry barrier left out, as the bench times calls). Writes the
tables into docs/SCALE.md between its two `<!-- measured_vs_model -->` markers (or prints them with --print).
Nothing is timed: `python benchmarks/runs/measured_vs_model.py` on any machine."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from tilec.perf.model import H200, mps_rank
from tilec.perf.taxes import TaxRow, taxes

RUNS = Path("benchmarks/results/h200-1gpu-mps/backends")
WORLD1 = [Path(f"benchmarks/results/h200-1gpu/{p}_paper_bf16.json") for p in ("ag_gemm", "gemm_rs", "gemm_ar")]
SHAPE = {"M": 8192, "N": 4608, "K": 36864}  # docs/SCALE.md's GEMM shape
MARK = "<!-- measured_vs_model -->"
SMS = {2: 66, 4: 32}  # what each rank reported under MPS at 100 / W percent (the runs' logs)


def predicted(program: str, world: int, shape: dict, config: dict) -> dict[str, float]:
    dims = {**shape, **{k: config[k] for k in ("BM", "BN", "BK")}}
    launch = {"num_warps": config["num_warps"], "group_m": config["group_m"]}
    machine = H200 if world == 1 else mps_rank(H200, world, SMS[world])
    got = taxes(program, world, dims, machine, launch=launch, entry_barrier=False)
    return {r.schedule: r.predicted_us for r in got if isinstance(r, TaxRow)}


def world1_table() -> list[str]:
    out = ["| program | schedule | config | measured (us) | predicted (us) | model error |",
           "|---|---|---|---|---|---|"]
    for js in WORLD1:
        run = json.loads(js.read_text())
        rows = [r for r in run["rows"] if r["kind"] == "tilec" and r["shape"] == SHAPE]
        if not rows:
            continue
        pred = predicted(run["meta"]["program"], 1, SHAPE, rows[0]["config"])
        for r in rows:
            cfg, p = r["config"], pred.get(r["name"])
            out.append(f"| `{Path(run['meta']['program']).name}` | {r['name']} | {cfg['BM']}x{cfg['BN']}x{cfg['BK']},"
                       f" {cfg['num_warps']} warps | {r['device_us']:,.0f} | "
                       + (f"{p:,.0f} | {(p / r['device_us'] - 1) * 100:+.0f}% |" if p else "- | - |"))
    return out


def table() -> list[str]:
    out = ["| program | ranks under MPS | schedule | config | Iris (us) | NVSHMEM (us) | NVSHMEM / Iris"
           " | predicted (us) | model error (Iris, NVSHMEM) |", "|---|---|---|---|---|---|---|---|---|"]
    for js in sorted(RUNS.glob("*.json")):
        run = json.loads(js.read_text())
        meta, rows = run["meta"], [r for r in run["rows"] if r["kind"] == "tilec"]
        world = meta["world"]
        by = {}
        for r in rows:
            schedule, _, backend = r["name"].partition(" [")
            by.setdefault(schedule, {})[backend.rstrip("]")] = r
        first = next(iter(by.values()))["iris"]
        pred = predicted(meta["program"], world, first["shape"], first["config"])
        for schedule, pair in by.items():
            iris, nv = pair["iris"]["device_us"], pair["nvshmem"]["device_us"]
            cfg = pair["iris"]["config"]
            p = pred.get(schedule)
            err = f"{(p / iris - 1) * 100:+.0f}%, {(p / nv - 1) * 100:+.0f}%" if p else "-"
            head = (f"| `{Path(meta['program']).name}` {'x'.join(str(v) for v in first['shape'].values())} | {world}"
                    f" | {schedule} | {cfg['BM']}x{cfg['BN']}x{cfg['BK']}, {cfg['num_warps']} warps | {iris:,.0f} |"
                    f" {nv:,.0f} | {nv / iris:.3f} |")
            out.append(f"{head} {p:,.0f} | {err} |" if p else f"{head} - | - |")
    return out


def main() -> None:
    text = "\n".join(["World 1, one H200 (Iris), 8192x4608x36864:", "", *world1_table(), "",
                      "Worlds 2 and 4 under MPS, both backends:", "", *table()])
    if "--print" in sys.argv:
        print(text)
        return
    doc = Path("docs/SCALE.md")
    body = doc.read_text()
    if body.count(MARK) != 2:
        sys.exit(f"docs/SCALE.md: needs two {MARK} markers")
    doc.write_text(re.sub(f"{MARK}.*?{MARK}", lambda _m: f"{MARK}\n{text}\n{MARK}", body, flags=re.S))
    print(f"wrote the table into {doc}")


if __name__ == "__main__":
    main()
