"""`--schedule auto`: pick the schedule with the cost model (tilec.model, the same one `tilec taxes` uses),
preferring times measured by `tilec bench` on this GPU for the same program, shape and world when there are some.

Choices and measurements are cached in <cache>/auto.json keyed by (program source, world, dims, device): the GPU's
name, or CPU_KEY for times of the CPU emulation (the Triton interpreter), which a GPU's choice never reads. The file
is updated under a lock and replaced atomically (tilec.fileio), so concurrent writers lose no record.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from tilec.fileio import read_json, update_json
from tilec.program import cache_dir

CPU_KEY = "cpu-interpreter"  # measurements of the CPU emulation: kept apart from every GPU's


def _path() -> Path:
    return cache_dir() / "auto.json"


def _gpu() -> str:
    """The device whose choices this process reads: the GPU's name, or CPU_KEY without one."""
    try:
        import torch

        return torch.cuda.get_device_name() if torch.cuda.is_available() else CPU_KEY
    except Exception:  # noqa: BLE001 - no torch GPU support: the CPU key
        return CPU_KEY


def device_key(heap) -> str:
    """The device a heap's kernels run on: CPU_KEY under the interpreter (even on a machine with a GPU)."""
    if heap.interpret:
        return CPU_KEY
    import torch

    return torch.cuda.get_device_name(heap.device)


def key(source: str, world: int, dims: dict[str, int], device: str | None = None) -> str:
    """The cache key of a program, shape and world on `device` (default: this process's GPU, else CPU_KEY)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    shape = ",".join(f"{k}={v}" for k, v in sorted(dims.items()))
    return f"{digest}|w{world}|{shape}|{device or _gpu()}"


def _load() -> dict:
    return read_json(_path())


def record_measured(k: str, schedule: str, micros: float) -> None:
    """Record a measured time under key `k` (built with the device the time was measured on)."""
    update_json(_path(), lambda d: d.setdefault(k, {}).setdefault("measured", {}).__setitem__(
        schedule, round(micros, 2)))


def candidates(program, source: str, world: int, dims: dict[str, int], bound_dims: dict[str, int],
               granularity: str = "auto", device: str | None = None) -> list[dict]:
    """Every schedule that applies, with its predicted (and, when measured on `device`, measured) time, best first.
    `program`: a path or a CompiledProgram of the same source (the model compiles every schedule from it);
    device: a GPU name or CPU_KEY (default: this process's GPU, else CPU_KEY)."""
    from tilec.model import rank_schedules

    k = key(source, world, {d: bound_dims[d] for d in bound_dims}, device)
    entry = _load().get(k, {})
    if "predicted" not in entry:  # the model compiles every schedule: outside the lock, then merged in
        predicted = dict(rank_schedules(program, world, dims, granularity=granularity))
        entry = update_json(_path(), lambda d: d.setdefault(k, {}).setdefault("predicted", predicted))[k]
    measured = entry.get("measured", {})
    rows = [{"schedule": s, "predicted_us": p, "measured_us": measured.get(s)} for s, p in entry["predicted"].items()]
    full = all(r["measured_us"] is not None for r in rows)
    rows.sort(key=lambda r: r["measured_us"] if full else r["predicted_us"])
    return rows
