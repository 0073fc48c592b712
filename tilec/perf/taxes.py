"""`tilec taxes`: what each schedule of a program pays in the three taxes of bulk-synchronous execution.

Static accounting, exact and CPU only, read off each schedule's compiled graph, per rank and per call:
  launches      one per kernel
  barriers      1 at entry + one before every kernel that has `barrier_before` + 1 at exit when the module has
                EXIT_BARRIER
  round trips   `buf` tensors written by one stage and read by another: bytes written, bytes read back counting
                re-reads (each consumer tile read, e.g. a GEMM re-reads every Ag row once per N-tile column) and the
                distinct bytes read. Inter-kernel when a reader sits in another kernel (the locality tax); a buffer
                written and read inside one fused kernel (fused-push's inbox) still goes through memory, so it is
                counted too, labelled intra-kernel.
  remote bytes  peer loads (`X@r`), pulls and pushes this rank issues; a load from `X@r` with r == rank is local
  flags         releases (one per producer task and flag) and waits: the poll rounds of the generated prologue
                (ir/wait_plan.py), one per counter a consumer task covers, its reductions included, except
                that the counters of one flag dim are polled as one block, and a wait that another of the task
                covers (same producer tiles, same range) is not emitted, so not counted; a folded stage's
                shared groups (codegen/flags.fold_share) wait once per arrival that shares but is not the last,
                counted where the kernel's tasks fit an H200's resident programs (as the bench sizes its grids;
                the generated code checks tl.num_programs at run time)
  transport     stages whose tiles the copy engines move (transport=dma) run in no kernel: their releases are one
                per chunk (flag counter); each rank's chunks (codegen/dma.py's DMA_COPIES) are kept with their bytes,
                issued copies and side stream, which the model turns into copy-engine time beside the kernels
Element counts are exact for masked (ragged) tiles; a loop variable that indexes two dims of one access is counted
as if independent. Where ranks differ, each number is the largest over ranks. `tilec.perf.model` turns it into time.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, fields, replace

import numpy as np

from tilec.codegen.dma import chunk_streams, dma_table
from tilec.codegen.emit import flag_scopes
from tilec.codegen.flags import fold_share
from tilec.codegen.text import ident
from tilec.errors import ArgumentError, CompileError, ScheduleError, TilecError, VerifyError
from tilec.ir.dtypes import ESIZE
from tilec.ir.graph import (
    DMA,
    InPlace,
    Pull,
    flags,
    folds,
    kernels_of,
    payload_of,
    program_of,
    sid,
    stages,
    tensor,
    waits,
)
from tilec.ir.tiling import invert
from tilec.ir.types import ME, Dot, Load, Sum, Var, trips
from tilec.ir.wait_plan import WaitPlan, plan_wait
from tilec.passes.schedules import SCHEDULES
from tilec.perf.model import Machine, Prediction, predict

COPY_ENGINES = "copy engines"  # StageCost.kernel of a stage with transport=dma


@dataclass(frozen=True)
class StageCost:
    """One stage's work per rank per call (buffer round trips are kept apart, in RoundTrip)."""

    name: str
    kernel: str
    tasks: int
    flops: int  # Dot FLOPs on 16-bit operands (tensor cores)
    flops_f32: int  # Dot FLOPs on f32 operands (ieee, CUDA cores)
    hbm_bytes: int  # distinct bytes of local non-buffer operands read + bytes stored locally
    remote_read_bytes: int
    remote_write_bytes: int
    flag_releases: int
    flag_waits: int
    remote_flag_waits: int  # waits on a peer's counter (a link round trip each)


@dataclass(frozen=True)
class KernelCost:
    name: str
    stages: tuple[str, ...]
    concurrent: bool
    share: float  # fraction of the GPU's programs it gets (concurrent kernels split them, as codegen does)
    groups: tuple[float, ...] = ()  # specialized: each stage's fraction of the kernel's programs, side by side


@dataclass(frozen=True)
class RoundTrip:
    tensor: str
    inter_kernel: bool  # some reader is in another kernel than a writer
    tensor_bytes: int
    write_bytes: int
    read_bytes: int  # every consumer tile read, re-reads included
    unique_read_bytes: int
    ce_write_bytes: int = 0  # the part of write_bytes the copy engines write (transport=dma)


@dataclass(frozen=True)
class CopyChunk:
    """One chunk of a dma stage on one rank: the copies behind one flag counter, in issue order."""

    stream: int  # the side stream runtime/dma.py issues it on (one per peer ring distance)
    bytes: int
    peer: bool  # it reads or writes a peer's memory (over the link)
    copies: int  # cudaMemcpy(2D)Async calls issued, the flag's 4-byte copy included


@dataclass(frozen=True)
class Static:
    """Exact accounting of one schedule, per rank per call."""

    schedule: str
    world: int
    dims: dict
    launches: int
    barriers: int
    barriers_entry: int
    barriers_between: int
    barriers_exit: int
    roundtrip_bytes: int  # inter-kernel buffers: written + read back (re-reads included)
    roundtrip_write_bytes: int
    roundtrip_read_bytes: int
    roundtrip_unique_read_bytes: int
    roundtrip_tensors: tuple[str, ...]
    intra_roundtrip_bytes: int  # the same for buffers written and read inside one kernel
    intra_roundtrip_tensors: tuple[str, ...]
    remote_read_bytes: int
    remote_write_bytes: int
    flag_releases: int
    flag_waits: int
    flops: int
    stage_costs: tuple[StageCost, ...]
    kernel_costs: tuple[KernelCost, ...]
    roundtrips: tuple[RoundTrip, ...]
    copy_engine_stages: tuple[str, ...]  # stages with transport=dma (in no kernel: the copy engines move their tiles)
    copy_engine_chunks: tuple[tuple[CopyChunk, ...], ...]  # per rank, in issue order (empty without dma stages)
    copy_engine_consumers: tuple[str, ...]  # stages that wait on a dma stage's flags


@dataclass(frozen=True)
class TaxRow(Prediction, Static):
    """One schedule: static accounting, the model's prediction and (--measure) the measured median time.
    Flat, so `pandas.DataFrame(map(dataclasses.asdict, rows))` gives one column per number."""

    measured_us: float | None = None
    note: str = ""


@dataclass(frozen=True)
class Skipped:
    schedule: str
    skipped: str  # why the schedule does not apply


# -- element counting -------------------------------------------------------------------------------


def _values(v: Var, q: int, world: int) -> np.ndarray:
    if v.kind == "me":
        return np.array([q], dtype=np.int64)
    if v.is_rank:
        return np.arange(world, dtype=np.int64)
    return np.arange(0, v.extent, v.step, dtype=np.int64)


def _dim_elements(a, d: int, scope: dict[str, Var], q: int, world: int) -> np.ndarray:
    """Every element index along dim d that the access touches over its variables, with multiplicity, masked
    where a tile overhangs its loop."""
    aff, tv = a.index[d], a.tile[d]
    start = np.array([aff.const], dtype=np.int64)
    tval = np.zeros(1, dtype=np.int64)
    for v, k in aff.terms:
        vals = _values(scope[v], q, world)
        start = (start[:, None] + k * vals[None, :]).ravel()
        tval = (tval[:, None] + (vals if v == tv else 0 * vals)[None, :]).ravel()
    off = np.arange(a.shape[d], dtype=np.int64)
    elems = start[:, None] + off[None, :]
    if tv is None:
        return elems.ravel()
    return elems[tval[:, None] + off[None, :] < scope[tv].extent]


def _index_vars(a) -> set[str]:
    return {v for aff in a.index for v in aff.vars}


def _repeats(a, scope: dict[str, Var]) -> int:
    """Loop variables that do not index the access repeat it (the access's rank var: once per rank)."""
    used = _index_vars(a)
    return trips(v for name, v in scope.items() if name not in used and v.kind != "me")


def _count(a, scope, q, world) -> tuple[int, int]:
    """(elements touched with repeats, distinct elements) of access `a` over `scope`."""
    dims = [_dim_elements(a, d, scope, q, world) for d in range(len(a.index))]
    total = _repeats(a, scope)
    uniq = world if a.rank != ME and a.rank not in _index_vars(a) else 1
    for e in dims:
        total *= len(e)
        uniq *= len(np.unique(e))
    return total, uniq


def _children(e) -> tuple:
    if isinstance(e, Sum):
        return (e.body,)
    if isinstance(e, Dot):
        return (e.lhs, e.rhs)
    return tuple(getattr(e, "args", ()))


def _walk_red(e, red: tuple[Var, ...] = ()):
    """(node, reduction vars of the sums enclosing it), pre-order."""
    yield e, red
    inner = (*red, e.var) if isinstance(e, Sum) else red
    for c in _children(e):
        yield from _walk_red(c, inner)


def _values_of(st) -> list:
    """Each stored expression once (several stores may share one tile function's results)."""
    out, seen = [], set()
    for s in st.body:
        if id(s.value) not in seen:
            seen.add(id(s.value))
            out.append(s.value)
    return out


# -- per stage ---------------------------------------------------------------------------------------


def _pull_remote(p: Pull, scope, q: int, world: int, total: int) -> int:
    """Elements of a pull read from another rank: the copy's rank var is solved per element of the buffer."""
    if p.source.rank == ME or isinstance(p, InPlace):  # in place: the peers' rows come from the local buffer
        return 0
    loops = {v.name: v for v in p.producer} | {ME: Var(ME, "me", world, 1, p.loc)}
    inv = next((d for d in invert(p.write, loops, set(), world, "taxes") if d.rank_var == p.source.rank), None)
    if inv is None:
        return total * (world - 1) // world
    e = _dim_elements(p.read, inv.dim, scope, q, world)
    r, _ = inv.solve(e)
    far = int(np.count_nonzero(inv.written(e) & (r != q)))
    return total // max(1, len(e)) * far


def _wait_count(g, w, red: tuple[Var, ...], scope, q: int, world: int, plan: WaitPlan) -> int:
    """Poll rounds one consumer stage spends per call on one wait: per task the flag range its reads cover, the
    whole reduction included (the generated prologue waits for it all at task start), the plan's block dim in
    blocks of counters."""
    read, rednames = w.read, {v.name for v in red}
    total, used = 1, set()
    for i, r in enumerate(plan.reach):  # the emitted wait's first and last counter, evaluated for every task
        d = r.dim
        aff, tv = read.index[d.dim], read.tile[d.dim]
        lo = np.array([aff.const], dtype=np.int64)
        tval = np.zeros(1, dtype=np.int64)
        for v, k in aff.terms:
            if v in rednames:
                continue
            used.add(v)
            vals = _values(scope[v], q, world)
            lo = (lo[:, None] + k * vals[None, :]).ravel()
            tval = (tval[:, None] + (vals if v == tv else 0 * vals)[None, :]).ravel()
        top = r.fixed + (np.minimum(r.tile.step, r.tile.extent - tval) - 1 if r.tile else 0)
        counters = d.lin(lo + top, clamp=False) - d.lin(lo, clamp=False) + 1
        total *= int(np.sum(-(-counters // plan.block) if i == plan.block_dim else counters))
    total *= trips(v for name, v in scope.items() if name not in used and name not in rednames and v.kind != "me")
    if read.rank in rednames:  # a wait inside a sum over ranks: one per rank
        total *= world
    return total


def _stage_cost(g, st, kernel: str, rt: set[str], q: int, world: int,
                scopes: dict[str, str]) -> tuple[StageCost, dict]:
    """Cost of one stage on rank q, and its buffer traffic: tensor -> [written, read, distinct read] bytes;
    scopes: flag_scopes(g), which wait plans are keyed by."""
    base = {v.name: v for v in st.loops} | {ME: Var(ME, "me", world, 1, st.loc)}
    tasks = st.tasks(world)
    # a stage that skips its rank loop's own value (local-in-place) runs (W-1)/W of its tasks and stores
    skip = (lambda n: n * (world - 1) // world) if st.skip_equal else (lambda n: n)
    flops = flops32 = hbm = rread = rwrite = 0
    bufs: dict[str, list[int]] = {}
    for s in st.body:
        a = s.access
        n, _ = _count(a, base, q, world)
        b = skip(n) * ESIZE[tensor(g, a.tensor).dtype]
        far = (b if st.skip_equal else b * (world - 1) // world) if a.remote else 0  # skipped: only peers left
        rwrite += far
        if a.tensor in rt:
            bufs.setdefault(a.tensor, [0, 0, 0])[0] += b
        else:
            hbm += b - far
    red_of: dict[str, tuple[Var, ...]] = {}
    in_place: set[str] = set()
    for value in _values_of(st):
        for e, red in _walk_red(value):
            scope = base | {v.name: v for v in red}
            if isinstance(e, Dot):
                n = 2 * int(np.prod(e.shape or (1,))) * (e.lhs.shape[-1] if e.lhs.shape else 1) * trips(red) * tasks
                if e.lhs.dtype == "f32":
                    flops32 += n
                else:
                    flops += n
            elif isinstance(e, InPlace):  # the peers' rows from the buffer (waited for), this rank's from the source
                red_of[str(e.read)] = red
                in_place.add(str(e.read))
                n, u = _count(e.read, scope, q, world)
                es = ESIZE[e.dtype]
                nb, ub = n * (world - 1) // world, u * (world - 1) // world
                if e.read.tensor in rt:
                    acc = bufs.setdefault(e.read.tensor, [0, 0, 0])
                    acc[1] += nb * es
                    acc[2] += ub * es
                else:
                    hbm += ub * es
                hbm += (u - ub) * es
            elif isinstance(e, Pull):
                n, u = _count(e.read, scope, q, world)
                far = _pull_remote(e, scope, q, world, n)
                rread += far * ESIZE[e.dtype]
                hbm += u * (n - far) // max(1, n) * ESIZE[e.dtype]  # the part of the source this rank holds
            elif isinstance(e, Load):
                a = e.access
                if str(a) in red_of:  # the same tile read twice in a task is one load (common subexpression)
                    continue
                red_of[str(a)] = red
                n, u = _count(a, scope, q, world)
                n, u = skip(n), skip(u)
                es = ESIZE[tensor(g, a.tensor).dtype]
                far = (n * es if st.skip_equal else n * es * (world - 1) // world) if a.remote else 0
                rread += far
                if a.tensor in rt:
                    acc = bufs.setdefault(a.tensor, [0, 0, 0])
                    acc[1] += n * es
                    acc[2] += u * es
                else:  # distinct bytes: re-reads of a tile come from L2; remote copies are the link's
                    hbm += u * es // (world if a.remote else 1)
    releases = tasks * sum(1 for _, _, d in g.out_edges(sid(st.name), data=True) if d["kind"] == "release")
    nwait = nremote = 0
    covered = set()
    folded = {fo.flag for fo in folds(g) if fo.consumer == st.name}  # no wait: run when complete
    for w in {(w.flag, str(w.read)): w for w in waits(g, st.name)}.values():  # one wait per counter range read
        if w.flag in folded:
            continue
        red = red_of.get(str(w.read), ())
        scope = base | {v.name: v for v in red}
        f = payload_of(g, f"f:{w.flag}")
        plan = plan_wait(g, f, w.read, {v.name for v in red}, scope, scopes[f.name])
        if plan.key in covered:  # the emitter drops it too
            continue
        covered.add(plan.key)
        n = _wait_count(g, w, red, scope, q, world, plan)
        n = n * (world - 1) // world if str(w.read) in in_place else n  # the tiles of this rank's rows do not wait
        nwait += n
        nremote += n * (world - 1) // world if w.read.remote else 0
    cost = StageCost(st.name, kernel, tasks, flops, flops32, hbm, rread, rwrite, releases, nwait, nremote)
    return cost, bufs


# -- per schedule -----------------------------------------------------------------------------------


def _exit_barrier(prog) -> bool:
    m = re.search(r"^EXIT_BARRIER = (True|False)$", prog.source, re.M)
    return m.group(1) == "True" if m else bool(prog.module.EXIT_BARRIER)


def _buffers_read_across(g, kernel_of: dict[str, str]) -> tuple[set[str], set[str]]:
    """(buffers written by one stage and read by another, those among them read in another kernel)."""
    writers: dict[str, set[str]] = {}
    readers: dict[str, set[str]] = {}
    for st in stages(g):
        for s in st.body:
            writers.setdefault(s.access.tensor, set()).add(st.name)
        for r in st.reads():
            if isinstance(r, Load | InPlace):
                readers.setdefault(r.read.tensor if isinstance(r, InPlace) else r.access.tensor, set()).add(st.name)
    rt, inter = set(), set()
    for t, ws in writers.items():
        if tensor(g, t).kind != "buf" or not (readers.get(t, set()) - ws):
            continue
        rt.add(t)
        if {kernel_of[r] for r in readers[t]} - {kernel_of[w] for w in ws}:
            inter.add(t)
    return rt, inter


def static(prog) -> Static:
    """Exact per-rank, per-call accounting of one compiled program (tilec.compile(...))."""
    g = prog.graph
    world = prog.world
    kernels = kernels_of(g)
    kernel_of = {s: k.name for k in kernels for s in k.stages}
    dma = {st.name for st in stages(g) if st.transport == DMA}
    kernel_of |= {s: COPY_ENGINES for s in dma}
    chunks = dma_table(g) if dma else {}
    rt, inter = _buffers_read_across(g, kernel_of)
    scopes = flag_scopes(g)
    per_rank = []
    for q in range(world):
        costs, traffic = [], {}
        for st in stages(g):
            c, bufs = _stage_cost(g, st, kernel_of[st.name], rt, q, world, scopes)
            if st.name in dma:  # a chunk sets its counter once
                mine = {f"F_{ident(f.name)}" for f in flags(g) if f.producer == st.name}
                c = replace(c, flag_releases=sum(1 for ch in chunks.get(q, ()) if ch[0] in mine))
            costs.append(c)
            for t, v in bufs.items():
                acc = traffic.setdefault(t, [0, 0, 0, 0])
                for i in range(3):
                    acc[i] += v[i]
                acc[3] += v[0] if st.name in dma else 0
        per_rank.append((costs, traffic))
    costs = _with_fold_waits(g, tuple(_max_rows([pr[0][i] for pr in per_rank]) for i in range(len(per_rank[0][0]))))
    trips = []
    for t in sorted(rt):
        w, r, u, ce = (max(pr[1].get(t, [0, 0, 0, 0])[i] for pr in per_rank) for i in range(4))
        tb = tensor(g, t).numel * ESIZE[tensor(g, t).dtype]
        trips.append(RoundTrip(t, t in inter, tb, w, r, u, ce))
    nconc = sum(1 for k in kernels if k.concurrent) or 1
    kcosts = tuple(KernelCost(k.name, k.stages, k.concurrent, 1.0 / nconc if k.concurrent else 1.0,
                              tuple(x / 1000 for x in getattr(k, "groups", ()))) for k in kernels)
    between = sum(1 for k in kernels if k.barrier_before)
    exit_ = int(_exit_barrier(prog))
    dims = dict(prog.program.dims) | dict(prog.program.tiles)
    xs = [x for x in trips if x.inter_kernel]
    ins = [x for x in trips if not x.inter_kernel]
    return Static(
        schedule=prog.schedule, world=world, dims=dims, launches=len(kernels),
        barriers=1 + between + exit_, barriers_entry=1, barriers_between=between, barriers_exit=exit_,
        roundtrip_bytes=sum(x.write_bytes + x.read_bytes for x in xs),
        roundtrip_write_bytes=sum(x.write_bytes for x in xs), roundtrip_read_bytes=sum(x.read_bytes for x in xs),
        roundtrip_unique_read_bytes=sum(x.unique_read_bytes for x in xs),
        roundtrip_tensors=tuple(x.tensor for x in xs),
        intra_roundtrip_bytes=sum(x.write_bytes + x.read_bytes for x in ins),
        intra_roundtrip_tensors=tuple(x.tensor for x in ins),
        remote_read_bytes=sum(c.remote_read_bytes for c in costs),
        remote_write_bytes=sum(c.remote_write_bytes for c in costs),
        flag_releases=sum(c.flag_releases for c in costs), flag_waits=sum(c.flag_waits for c in costs),
        flops=sum(c.flops + c.flops_f32 for c in costs),
        stage_costs=costs, kernel_costs=kcosts, roundtrips=tuple(trips),
        copy_engine_stages=tuple(sorted(dma)),
        copy_engine_chunks=tuple(_copy_chunks(g, chunks.get(q, ()), q) for q in range(world)) if dma else (),
        copy_engine_consumers=tuple(sorted({st.name for st in stages(g) for w in waits(g, st.name)
                                            if payload_of(g, f"f:{w.flag}").producer in dma})),
    )


def _with_fold_waits(g, costs: tuple) -> tuple:
    """Adds to each producer stage the waits of its shared folds: per group (a counter of the arrival flag), all
    but the last of the arrivals that share the consumer's tasks wait, where every task of the kernel has a
    program of its own (a persistent kernel without program groups whose loop tasks fit RESIDENT programs)."""
    from tilec.perf.model import Machine
    from tilec.runtime.launch import MAX_PROGRAMS_PER_SM

    resident = Machine().sms * MAX_PROGRAMS_PER_SM
    folded = {fo.consumer for fo in folds(g)}
    by_name = {c.name: i for i, c in enumerate(costs)}
    out = list(costs)
    for k in kernels_of(g):
        loop_tasks = sum(costs[by_name[s]].tasks for s in k.stages if s not in folded)
        if not k.persistent or k.groups or loop_tasks > resident:
            continue
        for fo in folds(g):
            f = payload_of(g, f"f:{fo.flag}")
            if fo.producer not in k.stages or f.count == 1:
                continue
            i = by_name[fo.producer]
            out[i] = replace(out[i], flag_waits=out[i].flag_waits + f.size * (fold_share(g, fo, f) - 1))
    return tuple(out)


def _copy_chunks(g, rows, q: int) -> tuple[CopyChunk, ...]:
    """Rank q's DMA_COPIES rows as CopyChunks, on the side streams runtime/dma.py gives them: one per ring distance
    of the chunk's peer (its local chunks on the stream of distance 0), at most MAX_STREAMS."""
    from tilec.runtime.dma import MAX_STREAMS

    out = []
    for (param, _counter, _owner, copies), stream in zip(rows, chunk_streams(rows, q, program_of(g).world,
                                                                            MAX_STREAMS), strict=True):
        nbytes = sum(c[8] * c[9] * ESIZE[tensor(g, c[0]).dtype] for c in copies)
        far = any(c[1] != q or c[5] != q for c in copies)
        out.append(CopyChunk(stream, nbytes, far, len(copies) + (param is not None)))
    return tuple(out)


def _max_rows(rows: list[StageCost]) -> StageCost:
    """Field-wise largest over ranks (the slowest rank sets the call's time)."""
    first = rows[0]
    vals = {f.name: (max(getattr(r, f.name) for r in rows) if isinstance(getattr(first, f.name), int)
                     else getattr(first, f.name)) for f in fields(StageCost)}
    return StageCost(**vals)


# -- the report ----------------------------------------------------------------------------------------


def compile_all(program, world: int | None = None, dims: dict[str, int] | None = None,
                schedules=SCHEDULES, granularity: str = "auto", launch: dict | None = None) -> list:
    """Each schedule compiled (CompiledProgram), or Skipped with the reason it does not apply."""
    import tilec
    from tilec.program import CompiledProgram

    src, path, own = None, program, None
    if isinstance(program, CompiledProgram):
        own = program
        if world is not None and world != own.world:
            raise TilecError(f"the program was compiled for world {own.world}, not {world}")
        world = own.world
        dims = dict(own.program.dims) | dict(own.program.tiles) | dict(dims or {})
        src, path = own.program.source, own.program.file
    elif not os.path.exists(program):
        raise TilecError(f"{program}: no such file")
    out = []
    for s in schedules:
        if own is not None and s == own.schedule and _same_transport(own, (launch or {}).get("transport", "sm")):
            out.append(own)
            continue
        try:
            out.append(tilec.compile(path, world=world or 1, schedule=s, dims=dims, granularity=granularity,
                                     source=src, **(launch or {})))
        except (ScheduleError, VerifyError) as e:  # a verifier failure is a compiler bug: say it, go on
            out.append(Skipped(s, str(e)))
        except (CompileError, ArgumentError):  # the program or an option is wrong: one error, not one per schedule
            raise
        except Exception as e:  # noqa: BLE001 - one schedule's compiler crash must not hide the others' taxes
            out.append(Skipped(s, f"the compiler failed: {type(e).__name__}: {e}"))
    return out


def uses_copy_engines(prog) -> bool:
    """Whether some stage of the compiled program runs on the copy engines (transport=dma)."""
    return any(st.transport == DMA for st in stages(prog.graph))


def _same_transport(prog, transport: str) -> bool:
    """Whether `prog` moves its copy stages as `transport` asks (sm: on the SMs; anything else: it has dma stages, so
    a program compiled with the SMs' copies is not reused for a dma request)."""
    return uses_copy_engines(prog) == (transport != "sm")


def taxes(program, world: int | None = None, dims: dict[str, int] | None = None, machine: Machine | None = None,
          *, schedules=SCHEDULES, granularity: str = "auto", measure: bool = False,
          entry_barrier: bool = True, launch: dict | None = None) -> list[TaxRow | Skipped]:
    """What each schedule pays, per rank per call: a TaxRow (static accounting + prediction) per schedule that
    applies, a Skipped (with the reason) per one that does not.

    program: a .tile path or a CompiledProgram (its schedule is reused, the others recompiled from its source at
    the same world, dims and tiles). machine: tilec.perf.model.Machine (default: H200 from docs/GPU.md).
    measure: also time each schedule on the GPUs (CUDA events); raises TilecError without a GPU.
    entry_barrier=False predicts a call made with entry_barrier=False (no entry and exit barriers), as
    `tilec bench` times them. launch: tilec.compile options of the measured kernels (num_warps, num_stages,
    group_m); the measured times are those of the tiles and launch options given, e.g. the ones `tilec bench` tuned.
    """
    machine = machine or Machine()
    compiled = compile_all(program, world, dims, schedules, granularity, launch)
    measured = measure_times([p for p in compiled if not isinstance(p, Skipped)]) if measure else {}
    rows: list[TaxRow | Skipped] = []
    for p in compiled:
        if isinstance(p, Skipped):
            rows.append(p)
            continue
        st = static(p)
        pred = predict(st, machine, entry_barrier=entry_barrier)
        m = measured.get(p.schedule)
        rows.append(TaxRow(**_fields(st), **_fields(pred), measured_us=m[0] if m else None,
                           note=m[1] if m else ""))
    return rows


def _fields(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}  # shallow, unlike asdict


# -- measurement (GPU only) ---------------------------------------------------------------------------


def gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


SHARED_GPU_NOTE = ("ranks share {gpus} GPU(s) (world {world}) without MPS: they time-slice it, so the measured times "
                   "say nothing about the barrier (BSP) tax of {world} GPUs")


def measure_times(progs: list, iters: int = 20, warmup: int = 3) -> dict[str, tuple[float, str]]:
    """schedule -> (median us of one call, entry barrier included, on the slowest rank; note), via CUDA events."""
    gpus = gpu_count()
    if not gpus:
        raise TilecError("measuring needs a CUDA GPU (none is visible); the predicted columns need none")
    if not progs:
        return {}
    from tilec.perf.measure import sharing_note
    from tilec.run_vs_reference import heap_bytes_for
    from tilec.runtime import spawn

    world = progs[0].world
    note = sharing_note(world)
    per_rank = spawn("tilec.perf.taxes:_measure_rank", world, backend="iris",
                     heap_bytes=sum(heap_bytes_for(p) for p in progs), timeout=1800, args=(progs, iters, warmup))
    return {p.schedule: (max(r[p.schedule] for r in per_rank), note) for p in progs}


def _measure_rank(heap, progs, iters: int, warmup: int) -> dict[str, float]:
    """In each rank process: median call time per schedule (tilec.perf.bench's timing: barrier outside the timer)."""
    from tilec.perf.inputs import bench_inputs
    from tilec.perf.measure import median_time

    out = {}
    for p in progs:
        mark = heap.mark()
        args = bench_inputs(p, heap, 0)
        out[p.schedule] = median_time(lambda p=p, a=args: p(heap, sync=False, **a), heap, iters, warmup) * 1e6
        heap.release(mark)
    return out
