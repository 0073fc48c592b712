"""`--schedule auto`: pick the schedule and the transport of its copy stages with the cost model (tilec.perf.model,
the same one `tilec taxes` uses), preferring times measured by `tilec bench` / `tilec tune` on this GPU for the same
program, shape and world when there are some.

The candidates are variants, named as `tilec bench --schedules` spells them: every schedule that applies with its
copy stages on the SMs ("flags"), and, where passes/transport.py accepts transport=dma for it, the same schedule
with them on the copy engines ("flags+dma"). The choice lives here, not in the compiler: `transport=auto` in
tilec.compile (below the cost model) means sm.

Choices and measurements are cached in <cache>/auto.json keyed by (program source, world, dims, device): the GPU's
name, or CPU_KEY for times of the CPU emulation (the Triton interpreter), which a GPU's choice never reads. An
entry holds PREDICTED (the model's times of every variant on the H200 defaults; PREDICTED@HASH on the machine
file TILEC_MACHINE names) and "measured" (variant -> us). Entries written before transports were ranked hold
"predicted" (schedules only, an older model): it is not read, and their measured times, all of SM-transport
schedules, keep their meaning. The file is updated under a lock and replaced atomically
(tilec.fileio), so concurrent writers lose no record.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from tilec import settings
from tilec.fileio import read_json, update_json
from tilec.ir.dtypes import ESIZE
from tilec.ir.queries import pull_rereads
from tilec.perf.measure import CPU_KEY, device_key, this_device  # noqa: F401 - CPU_KEY, device_key: re-exported
from tilec.perf.model import Machine
from tilec.perf.taxes import Skipped, TaxRow, compile_all, taxes, uses_copy_engines
from tilec.program import cache_dir

PREDICTED = "predicted_v2"  # the model's times of every variant (v1, "predicted": schedules only)
DMA = "dma"


def machine(world: int | None = None) -> Machine:
    """The machine `auto` ranks for: the file TILEC_MACHINE names (`tilec calibrate -o FILE`), else the H200
    defaults (docs/GPU.md); for `world` ranks side by side on one GPU under MPS, one rank's share of it
    (model.mps_rank: its SMs, links through HBM)."""
    path = settings.value("TILEC_MACHINE")
    return Machine.load(path) if path else default_machine(world)


def default_machine(world: int | None = None) -> Machine:
    """The H200 defaults (docs/GPU.md), or for `world` ranks side by side on one GPU under MPS one rank's share of
    them (model.mps_rank: its SMs, links through HBM)."""
    if world is not None and world > 1:
        from tilec.perf.measure import gpu_sharing, mps_sms

        if gpu_sharing(world) == "mps":
            from tilec.perf.model import mps_rank

            return mps_rank(Machine(), world, mps_sms())
    return Machine()


def _predicted_field(m: Machine) -> str:
    """PREDICTED for the default machine; a calibrated one's predictions are kept apart, under its rates' hash."""
    if m == Machine():
        return PREDICTED
    return f"{PREDICTED}@{hashlib.sha256(json.dumps(asdict(m), sort_keys=True).encode()).hexdigest()[:8]}"


def variant(schedule: str, transport: str = "sm") -> str:
    """The name of a candidate: "flags" (copy stages on the SMs) or "flags+dma" (on the copy engines)."""
    return schedule if transport == "sm" else f"{schedule}+{transport}"


def split_variant(name: str) -> tuple[str, str]:
    """"flags+dma" -> ("flags", "dma"); "flags" -> ("flags", "sm")."""
    schedule, _, transport = name.partition("+")
    return schedule, transport or "sm"


def variant_of(prog) -> str:
    """The candidate name of a compiled program: its schedule, "+dma" when some stage runs on the copy engines."""
    return variant(prog.schedule, DMA if uses_copy_engines(prog) else "sm")


def compile_variant(program, world: int, name: str, dims: dict[str, int] | None = None, **options):
    """`tilec.compile` of a candidate by name ("flags+dma": schedule flags, transport dma)."""
    from tilec.api import compile as compile_program

    schedule, transport = split_variant(name)
    return compile_program(program, world, schedule, dims, transport=transport, **options)


def _path() -> Path:
    return cache_dir() / "auto.json"


def key(source: str, world: int, dims: dict[str, int], device: str | None = None,
        options: settings.Options | None = None, kernels: dict | None = None) -> str:
    """The cache key of a program, shape and world on `device` (default: this process's GPU, else CPU_KEY), built
    with `options` (default: the compile options in `kernels`, tilec.perf.measure.kernel_backend's): times measured
    with other options (`tilec bench --fold off`) land under a key of their own, never under the default program's."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:12]
    shape = ",".join(f"{k}={v}" for k, v in sorted(dims.items()))
    opts = options if options is not None else settings.built_with(kernels)
    return f"{digest}|w{world}|{shape}|{device or this_device()}{options_suffix(opts)}{backend_suffix(kernels, world)}"


def options_suffix(opts: settings.Options) -> str:
    """A key's part for programs built with other options than the defaults ("" for the defaults' programs)."""
    return "" if opts == settings.Options() else f"|{opts.line().removeprefix('settings: ')}"


def backend_suffix(kernels: dict | None, world: int) -> str:
    """The key's part for kernels of backend nvshmem (tilec.perf.measure.kernel_backend's options): "|nvshmem" on one
    node, "|nvshmem/rpn=R" across nodes of R; "" for Iris's kernels (the keys written before backends were)."""
    if not kernels or kernels.get("backend", "iris") != "nvshmem":
        return ""
    rpn = kernels.get("ranks_per_node") or world
    return "|nvshmem" + (f"/rpn={rpn}" if rpn < world else "")


def _load() -> dict:
    return read_json(_path())


def record_measured(k: str, schedule: str, micros: float) -> None:
    """Record a measured time under key `k` (built with the device the time was measured on)."""
    update_json(_path(), lambda d: d.setdefault(k, {}).setdefault("measured", {}).__setitem__(
        schedule, round(micros, 2)))


def backend_pick(source: str, world: int, dims: dict[str, int], kernels: dict | None,
                 device: str | None = None) -> tuple[dict | None, str | None]:
    """The kernels `--schedule auto` runs: kernels of backend nvshmem on one node give way to Iris's where `tilec
    bench` (or `tilec tune`) measured Iris faster for this program, shape and world on `device` (the best of the
    variants timed on both); then (Iris's: the compile options of `kernels` alone, or None; why). Else (kernels,
    None): across nodes only NVSHMEM reaches the peers, and without both measurements the backend asked for stays."""
    if not kernels or kernels.get("backend") != "nvshmem" or (kernels.get("ranks_per_node") or world) < world:
        return kernels, None
    entries = _load()
    iris_kernels = settings.given_options(kernels) or None  # Iris's kernels built with the same options
    iris = entries.get(key(source, world, dims, device, kernels=iris_kernels), {}).get("measured", {})
    nv = entries.get(key(source, world, dims, device, kernels=kernels), {}).get("measured", {})
    both = set(iris) & set(nv)
    if not both:
        return kernels, None
    best_iris, best_nv = min(both, key=iris.get), min(both, key=nv.get)
    if iris[best_iris] >= nv[best_nv]:
        return kernels, None
    return iris_kernels, (f"--schedule auto: backend nvshmem within one node measured {nv[best_nv]:.0f} us ({best_nv})"
                          f" here, Iris {iris[best_iris]:.0f} us ({best_iris}): running Iris's kernels on an Iris heap")


def candidates(program, source: str, world: int, dims: dict[str, int], bound_dims: dict[str, int],
               granularity: str = "auto", device: str | None = None, ranks_per_node: int | None = None,
               kernels: dict | None = None) -> list[dict]:
    """Every variant that applies (schedule, and schedule+dma where its copy stages can run on the copy engines),
    with its predicted (and, when measured on `device`, measured) time, best first: by measured time once every
    variant has one, else by the model. `program`: a path or a CompiledProgram of the same source (the model
    compiles every variant from it); device: a GPU name or CPU_KEY (default: this process's GPU, else CPU_KEY);
    ranks_per_node below the world: the model ranks for nodes of that many, IB between them (model.across_nodes);
    kernels: the backend options the times were measured with (measure.kernel_backend; None: Iris's kernels)."""
    ranks_per_node = ranks_per_node or (kernels or {}).get("ranks_per_node")
    k = key(source, world, {d: bound_dims[d] for d in bound_dims}, device, kernels=kernels)
    entry = _load().get(k, {})
    m = machine(world)
    if ranks_per_node and ranks_per_node < world:
        from tilec.perf.model import across_nodes

        m = across_nodes(m, world, ranks_per_node)
    # predictions depend on the tile sizes and flag granularity asked for, which the key (the program's shape) leaves
    # out so that measured times of a shape are found whatever tiles the tuner picked: keep each request's apart
    asked = [f"{d}={v}" for d, v in sorted(dims.items()) if d not in bound_dims]
    asked += [f"granularity={granularity}"] if granularity != "auto" else []
    field = _predicted_field(m) + (f"|{','.join(asked)}" if asked else "")
    if field not in entry:  # the model compiles every variant: outside the lock, then merged in
        predicted = dict(rank_schedules(program, world, dims, m, granularity=granularity))
        entry = update_json(_path(), lambda d: d.setdefault(k, {}).setdefault(field, predicted))[k]
    measured = entry.get("measured", {})
    rows = [{"schedule": s, "predicted_us": p, "measured_us": measured.get(s)} for s, p in entry[field].items()]
    if ranks_per_node and ranks_per_node < world:  # the copy engines reach peers by pointer, only on a node
        rows = [r for r in rows if split_variant(r["schedule"])[1] == "sm"]
    full = all(r["measured_us"] is not None for r in rows)
    rows.sort(key=lambda r: r["measured_us"] if full else r["predicted_us"])
    return rows


def compile_auto(program, world: int = 1, dims: dict[str, int] | None = None, *, granularity: str = "auto",
                 source: str | None = None, transport: str | None = None, schedule: str | None = None, **options):
    """`tilec.compile` with the variant (schedule and transport) the cost model ranks first (measured times of this
    shape on this device win when every variant has one); the ranking is kept on the result as `prog.candidates`.
    transport: None or "auto" (the model picks sm or dma), "sm" or "dma" (only variants of that transport), or a
    per-stage spec (STAGE=MODE,...: the best SM variant's schedule, compiled with that spec). schedule: only that
    schedule's variants (`tilec.compile(..., transport="auto")` routed here by the CLI)."""
    from tilec.api import compile as compile_program

    base = compile_program(program, world, "bsp", dims, granularity=granularity, source=source,
                           retype=options.get("retype"))
    asked = {k: options[k] for k in ("backend", "ranks_per_node", *settings.OPTIONS) if options.get(k) is not None}
    kernels, why = backend_pick(base.program.source, world, dict(base.program.dims), asked or None)
    if why:  # Iris measured faster on one node: its kernels
        options = {k: v for k, v in options.items() if k not in ("backend", "ranks_per_node")}
    ranking = candidates(base, base.program.source, world, dims or {}, dict(base.program.dims), granularity,
                         ranks_per_node=options.get("ranks_per_node"), kernels=kernels)
    rows = [r for r in ranking if schedule is None or split_variant(r["schedule"])[0] == schedule]
    kind = transport if transport in ("sm", DMA) else "sm" if transport not in (None, "auto") else None
    rows = [r for r in rows if kind is None or split_variant(r["schedule"])[1] == kind]
    if not rows:
        from tilec.errors import ScheduleError

        if schedule is not None:  # a named schedule: its own reason (it does not apply, or not on that transport)
            compile_program(program, world, schedule, dims, granularity=granularity, source=base.program.source,
                            transport="sm" if transport in (None, "auto") else transport, **options)
        asked_for = f"--schedule {schedule}" if schedule else "--schedule auto"
        raise ScheduleError(f"{asked_for}: no {schedule or 'schedule'} applies with transport={transport}"
                            f" (candidates: {', '.join(r['schedule'] for r in ranking) or 'none'})")
    pick, how = split_variant(rows[0]["schedule"])
    if transport not in (None, "auto", "sm", DMA):
        how = transport  # STAGE=MODE,...: the user's spec on the model's schedule
    prog = compile_program(program, world, pick, dims, granularity=granularity, source=base.program.source,
                           transport=how, **options)
    prog.candidates = ranking
    prog.backend_note = why
    return prog


def rank_schedules(program, world: int, dims: dict[str, int] | None = None, machine=None, transports=("sm", DMA),
                   **kw) -> list[tuple[str, float]]:
    """(variant, predicted us) for every schedule that applies, and every schedule+dma whose copy stages the copy
    engines can move (passes/transport.py decides), fastest first (for `--schedule auto`); fused-pull is left out
    where it re-reads REREAD_BYTES or more from the peers (pull_rereads) and another schedule applies."""
    launch = dict(kw.pop("launch", None) or {})
    ranked = []
    for t in transports:
        rows = taxes(program, world, dims, machine, launch={**launch, "transport": t}, **kw)
        ranked += [(variant(r.schedule, t), r.predicted_us) for r in rows
                   if isinstance(r, TaxRow) and (t == "sm" or r.copy_engine_stages)]
    ranked.sort(key=lambda x: x[1])
    hbm_link = machine is not None and machine.link == "hbm"  # re-reads of a peer on the same GPU hit its HBM and L2
    if len(ranked) > 1 and not hbm_link and any(s == "fused-pull" for s, _ in ranked) and \
            reread_bytes(program, world, dims, kw.get("granularity", "auto")) >= REREAD_BYTES:
        ranked = [x for x in ranked if x[0] != "fused-pull"]
    return ranked


# Measured on two H200 (benchmarks/results/h200-x2/ag_gemm_paper_bf16.log): fused-pull ran at 0.21-0.41x of the best
# baseline on every paper shape, each remote A tile pulled again for every column block; the model does not see the
# link's cost of re-reads (they are not L2 hits across NVLink). Below this many re-read bytes per rank and call (small
# shapes) the model decides.
REREAD_BYTES = 16 << 20


def reread_bytes(program, world: int, dims: dict[str, int] | None, granularity: str = "auto") -> int:
    """Bytes per rank and call that fused-pull reads from the peers more than once (0 where it does not apply)."""
    (p,) = compile_all(program, world, dims, ("fused-pull",), granularity)
    if isinstance(p, Skipped):
        return 0
    total = 0
    for _c, pull, n, _loops in pull_rereads(p.graph):
        t = next(x for x in p.program.tensors if x.name == pull.source.tensor)
        total += (n - 1) * t.numel * ESIZE[t.dtype] * (p.world - 1)  # the peers' shards, once per extra pass
    return total
