"""`--schedule auto`: pick the schedule with the cost model (tilec.perf.model, the same one `tilec taxes` uses),
preferring times measured by `tilec bench` on this GPU for the same program, shape and world when there are some.

Choices and measurements are cached in <cache>/auto.json keyed by (program source, world, dims, GPU).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from tilec.perf.taxes import TaxRow, taxes
from tilec.program import cache_dir


def _path() -> Path:
    return cache_dir() / "auto.json"


def _gpu() -> str:
    try:
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001 - no torch GPU support: the CPU key
        return "cpu"


def key(source: str, world: int, dims: dict[str, int]) -> str:
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    shape = ",".join(f"{k}={v}" for k, v in sorted(dims.items()))
    return f"{digest}|w{world}|{shape}|{_gpu()}"


def _load() -> dict:
    try:
        return json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}


def _store(data: dict) -> None:
    tmp = _path().with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, _path())


def record_measured(k: str, schedule: str, micros: float) -> None:
    data = _load()
    data.setdefault(k, {}).setdefault("measured", {})[schedule] = round(micros, 2)
    _store(data)


def candidates(program, source: str, world: int, dims: dict[str, int], bound_dims: dict[str, int],
               granularity: str = "auto") -> list[dict]:
    """Every schedule that applies, with its predicted (and, when benchmarked here, measured) time, best first.
    `program`: a path or a CompiledProgram of the same source (the model compiles every schedule from it)."""
    k = key(source, world, {d: bound_dims[d] for d in bound_dims})
    data = _load()
    entry = data.get(k, {})
    if "predicted" not in entry:
        entry["predicted"] = dict(rank_schedules(program, world, dims, granularity=granularity))
        data[k] = entry
        _store(data)
    measured = entry.get("measured", {})
    rows = [{"schedule": s, "predicted_us": p, "measured_us": measured.get(s)} for s, p in entry["predicted"].items()]
    full = all(r["measured_us"] is not None for r in rows)
    rows.sort(key=lambda r: r["measured_us"] if full else r["predicted_us"])
    return rows


def compile_auto(program, world: int = 1, dims: dict[str, int] | None = None, *, granularity: str = "auto",
                 source: str | None = None, **options):
    """`tilec.compile` with the schedule the cost model ranks first (measured times of this shape on this device
    win when every legal schedule has one); the ranking is kept on the result as `prog.candidates`."""
    from tilec.api import compile as compile_program

    base = compile_program(program, world, "bsp", dims, granularity=granularity, source=source,
                           retype=options.get("retype"))
    ranking = candidates(base, base.program.source, world, dims or {}, dict(base.program.dims), granularity)
    prog = compile_program(program, world, ranking[0]["schedule"], dims, granularity=granularity,
                           source=base.program.source, **options)
    prog.candidates = ranking
    return prog


def rank_schedules(program, world: int, dims: dict[str, int] | None = None, machine=None,
                   **kw) -> list[tuple[str, float]]:
    """(schedule, predicted us) for every schedule that applies, fastest first (for `--schedule auto`)."""
    rows = taxes(program, world, dims, machine, **kw)
    return sorted(((r.schedule, r.predicted_us) for r in rows if isinstance(r, TaxRow)), key=lambda x: x[1])
