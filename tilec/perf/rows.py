"""The bench's arithmetic over one shape's rows, kept apart from any timing so that a test can check it on fake
timings: which baseline is the best, each row's ratio to it, and each row's fraction of the physical floor.

Row kinds: "tilec" (a schedule), "baseline" (what a careful PyTorch user would run: best of them is the bar),
"reference" (a labelled comparison that is not a fair baseline, e.g. the naive torch decode, or a lower bound
timed without communication) and "floor" (the physical limit: cuBLAS alone on the whole problem, or the KV bytes
over the copy bandwidth). Ratios compare device time with device time.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("tilec", "baseline", "reference", "floor")


@dataclass
class TimedRow:
    """What every bench row has (the GEMM and decode rows add their own metrics after these)."""

    program: str
    shape: dict
    world: int
    dtype: str
    name: str  # schedule or baseline
    kind: str  # one of KINDS
    device_us: float  # median device time (how: `timing`)
    p10_us: float
    p90_us: float
    min_us: float
    max_us: float
    iters: int
    timing: str
    host_us: float | None  # one eager Python call until its device work is done (median of a few)


def rel_err(out, ref) -> float | None:
    """max |out - ref| / max |ref| (5 significant digits) of a row's output against the reference; None without a
    reference. A shape mismatch, or a value that is not finite where the reference is, is an infinite error, so
    a NaN never passes a tolerance check."""
    if out is None or ref is None:
        return None
    out, ref = out.float(), ref.float().to(out.device)
    if out.shape != ref.shape:
        return float("inf")
    if not ref.numel():
        return 0.0
    if not out[ref.isfinite()].isfinite().all():
        return float("inf")
    diff, scale = float((out - ref).abs().max()), float(ref.abs().max())
    return float(f"{diff / scale:.5g}") if scale > 0 else diff


def best_baseline(rows) -> object | None:
    """The fastest row of kind "baseline" by device time (references and floors never count)."""
    base = [r for r in rows if r.kind == "baseline" and r.device_us and r.device_us > 0]
    return min(base, key=lambda r: r.device_us, default=None)


def finish_shape(rows, floor_us: float | None = None) -> None:
    """Fill, in place, each row's `best_baseline`, `ratio_to_best_baseline` (best baseline's device time / the
    row's: > 1 is faster than the bar), `floor_us` (a "floor" row's device time, else the given one) and
    `frac_of_floor` (floor / the row's device time: 1 is at the floor)."""
    for r in rows:
        if r.kind not in KINDS:
            raise ValueError(f"row {r.name}: kind {r.kind!r} is not one of {', '.join(KINDS)}")
    best = best_baseline(rows)
    floors = [r.device_us for r in rows if r.kind == "floor" and r.device_us]
    if floors:
        floor_us = min(floors)
    for r in rows:
        r.best_baseline = best.name if best else None
        r.ratio_to_best_baseline = float(f"{best.device_us / r.device_us:.4g}") if best and r.device_us else None
        r.floor_us = float(f"{floor_us:.6g}") if floor_us else None
        r.frac_of_floor = float(f"{floor_us / r.device_us:.4g}") if floor_us and r.device_us else None


def best_tilec(rows) -> object | None:
    return min((r for r in rows if r.kind == "tilec" and r.device_us), key=lambda r: r.device_us, default=None)


def table_text(rows: list[dict]) -> str:
    """One line per row: device time (median, p10-p90), host time, the ratio to the best baseline (device time
    against device time), the fraction of the floor, memory, the output's error."""
    head = (f"{'shape':<22}{'name':<30}{'kind':<10}{'device us':>11}{'p10-p90':>22}{'host us':>10}"
            f"{'vs best':>9}{'of floor':>9}{'mem MB':>9}{'rel err':>9}")
    out = [head]
    for r in rows:
        shp = r.get("label") or "x".join(str(v) for v in r["shape"].values())
        ratio = f"{r['ratio_to_best_baseline']:.3g}x" if r.get("ratio_to_best_baseline") else "-"
        floor = f"{r['frac_of_floor']:.3g}" if r.get("frac_of_floor") else "-"
        host = f"{r['host_us']:.1f}" if r.get("host_us") is not None else "-"
        mem = (r.get("peak_mem_bytes") or 0) + (r.get("heap_bytes") or 0)
        err = f"{r['rel_err']:.1e}" if r.get("rel_err") is not None else "-"
        spread = f"{r['p10_us']:.1f}-{r['p90_us']:.1f}"  # one column however wide the times (CPU: seconds)
        out.append(f"{shp:<22}{r['name'][:29]:<30}{r['kind']:<10}{r['device_us']:>11.1f}"
                   f" {spread:>21}{host:>10}{ratio:>9}{floor:>9}{mem / 2**20:>9.0f}{err:>9}")
    return "\n".join(out)


TIMING_FIELDS = ("device_us", "p10_us", "p90_us", "min_us", "max_us", "iters", "timing")


def second_round(retime: list, rebuild, rates: tuple[str, ...] = ()) -> None:
    """Times every row of a shape again, in reverse order, and keeps each row's faster round. retime: (row, a
    function timing it again -> Timing) in the first round's order; rebuild(row, timing) -> a row of that timing,
    whose TIMING_FIELDS and `rates` (the metrics of device time: GB/s, TFLOP/s) replace the row's where it is
    faster. Whatever ran just before a timing can slow all of its replays: on an H200 the first op timed after the
    f32 reference of a decode shape ran 277 us where it ran 244 us before and after (clocks unchanged;
    benchmarks/results/h200-1gpu/bench_rounds/order_probe.log), so one round in a fixed order favours the rows timed
    late. Two rounds in opposite orders, the better of each row's two, give every row (baselines and tilec alike)
    the same chance. A row whose second timing fails keeps its first."""
    for r, again in reversed(retime):
        try:
            t = again()
        except Exception:  # noqa: BLE001 - the first round's timing stands; it ran and was checked
            r.rounds_us = [r.device_us]
            continue
        first = r.device_us
        if t.device_us < first:
            faster = rebuild(r, t)
            for f in (*TIMING_FIELDS, *rates):
                setattr(r, f, getattr(faster, f))
        r.rounds_us = [first, float(f"{t.device_us:.5g}")]


def rounds_text(rows) -> str:
    """`name first -> second us, ...` of the rows a second round timed (the bench logs it per shape)."""
    return ", ".join(f"{r.name} {' -> '.join(f'{x:.1f}' for x in r.rounds_us)}us" for r in rows if r.rounds_us)
