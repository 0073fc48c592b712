"""Both backends measured side by side against the cost model: reads the `tilec bench --backend iris,nvshmem` runs
under MPS (benchmarks/results/h200-1gpu-mps/backends/*.json), predicts every tilec row at the tile config it ran
with (tilec.perf.taxes on tilec.perf.model.mps_rank of the SMs the run reported, entry barrier left out as the bench
times calls), and writes the table into docs/SCALE.md between its two `<!-- backends_measured -->` markers (or prints
it with --print). Nothing is timed: `python benchmarks/runs/backends_vs_model.py` on any machine."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from tilec.perf.model import H200, mps_rank
from tilec.perf.taxes import TaxRow, taxes

RUNS = Path("benchmarks/results/h200-1gpu-mps/backends")
MARK = "<!-- backends_measured -->"
SMS = {2: 66, 4: 32}  # what each rank reported under MPS at 100 / W percent (the runs' logs)


def predicted(program: str, world: int, shape: dict, config: dict) -> dict[str, float]:
    dims = {**shape, **{k: config[k] for k in ("BM", "BN", "BK")}}
    launch = {"num_warps": config["num_warps"], "group_m": config["group_m"]}
    got = taxes(program, world, dims, mps_rank(H200, world, SMS[world]), launch=launch, entry_barrier=False)
    return {r.schedule: r.predicted_us for r in got if isinstance(r, TaxRow)}


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
    text = "\n".join(table())
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
