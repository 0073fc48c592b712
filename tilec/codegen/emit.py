"""The render-model pass: the final graph -> a ModuleModel of plain strings that the jinja2 template only prints.

Each kernel is a persistent loop over the tasks of its stages (task = program id, then every NPROG-th; or claimed,
kir.For.claim); each task decodes its loop variables, waits for the producer tiles it reads, computes, stores, and
releases its flags. Dims are compile-time constants, so masks are emitted only where a tile really overhangs its loop.

The emitter is one class put together from what it emits, each part building kernel-IR nodes (build.py): tile reads
and copies (copies.py), tile math, GEMMs and reductions (compute.py), flag waits and releases (flags.py) and whole
tasks (tasks.py); this module builds the kernels (the persistent loop, merged stages, program groups), simplifies
and prints them (rewrites.py, triton_printer.py) and makes the module model.
"""

from __future__ import annotations

import json
from dataclasses import replace

import networkx as nx

from tilec.ir.gather import Counted
from tilec.ir.graph import (
    Kernel,
    Pull,
    flags,
    folds,
    kernels_of,
    kind_of,
    node_order,
    passes_run,
    payload_of,
    program_of,
    stage,
    stages,
    tensor,
    tensors,
    waits,
)
from tilec.ir.types import ME, Access, Sum, Var, trips, walk

from . import gathers, kir
from .build import At, E, add, assemble, assign, call, cmp, fdiv, mod, mul, sub
from .compute import Compute
from .copies import Copies
from .dma import table_lines
from .flags import TASK_ARGS_MARK, Flags, flag_scopes, silent_flags
from .model import FlagModel, KernelModel, ModuleModel, TaskFn, TensorModel
from .nvshmem_printer import backend_fields, printer_for
from .order import Overlap, copy_order, overlap_plan, own_rows_first, own_rows_last
from .rewrites import bind_constants, order_waits, range_names, rename, simplify
from .tasks import Tasks
from .text import FIXED_NAMES, Names, ident
from .triton_printer import Printer, wrap

__all__ = ["build_model", "flag_scopes", "ModuleModel"]

# per-task arguments after the buffers (the kernel passes its own on to each stage's task function)
TASK_ARGS = ("ERR", "heap_bases", "rank", "epoch", "timeout_ns", "INTERPRET")


def param_name(buffer: str) -> str:
    """A kernel's parameter for a buffer: its name, unless that is one of the kernel's own names or Python's."""
    return buffer + "_" if buffer in FIXED_NAMES else buffer


def _taken_names(g: nx.DiGraph) -> set[str]:
    """Names a temporary must not take: every tensor, flag parameter and loop variable (and its `_r` range)."""
    prog = program_of(g)
    names = {t.name for t in prog.tensors} | {param_name(t.name) for t in prog.tensors}
    names |= {f"F_{ident(f.name)}" for f in flags(g)} | {"_tl_start", "_tl_waited"}
    for st in stages(g):
        vs = {v.name for v in st.loops}
        vs |= {x.var.name for s in st.body for x in walk(s.value) if isinstance(x, Sum)}
        names |= vs | {f"{v}_r" for v in vs} | {"t_mn", *(f"t_{i}" for i in range(len(st.loops)))}
    return names


class _Emitter(Copies, Compute, Flags, Tasks):
    """Emits the lines of one task of one stage."""

    def __init__(self, g: nx.DiGraph, st, flag_no: dict[str, int], flag_scope: dict[str, str],
                 attend_block: int = 64, taken: set[str] | None = None):
        self.g, self.st = g, st
        self.attend_block = attend_block  # keys per block of a streamed attend
        self.world = program_of(g).world
        self.prologue: list[At] = []  # per-task setup (peer offsets, hoisted index math)
        self.peers: dict[tuple, kir.Expr] = {}  # (peer, element size) -> its offset's name in the prologue
        self.wait_lines: list[At] = []  # the task's flag waits, first thing after decoding its tile
        self.waited: set[tuple] = set()  # what the waits emitted so far cover (see wait)
        self.names = Names(taken if taken is not None else _taken_names(g))
        self.flag_no = flag_no
        self.scope: dict[str, Var] = {v.name: v for v in st.loops} | {ME: Var(ME, "me", self.world, 1, st.loc)}
        self.loop_vars: set[str] = set()  # reduction vars bound by an enclosing emitted loop
        self.waits: dict[Access, list] = {}
        for w in waits(g, st.name):
            self.waits.setdefault(w.read, []).append(w)
        self.params: list[str] = []  # the buffers the task reads and writes, in order of first use
        self.fl = {f.name: f for f in flags(g)}
        self.flag_scope = flag_scope  # flag -> "gpu" or "sys" (flag_scopes)
        self.ptrs: dict[Access, str] = {}  # access -> pointer walked along an enclosing reduction
        self.memo: dict[int, tuple[str, str]] = {}  # tile-function calls shared by several stores
        self.fused_sums: dict[int, kir.Expr] = {}  # sums computed in one loop with their siblings (sums_in_one_loop)
        self.walked: dict[int, tuple] = {}  # in-place read -> (pointers, mask, own) walked along its reduction
        self.all_running: int | None = None  # the kernel's loop tasks, when a grid may hold them all (flags.arrive)

    def tmp(self, stem: str) -> str:
        """A fresh local named after what it holds (text.Names)."""
        return self.names.new(stem)

    def param(self, name: str) -> str:
        if name not in self.params:
            self.params.append(name)
        return param_name(name)

    # -- index arithmetic --------------------------------------------------------------------------
    @staticmethod
    def scalar(terms, const: int, names: dict[str, str] | None = None) -> kir.Expr:
        """sum(k * v) + const (a term's v: a variable's name, renamed by `names`, or an expression)."""
        parts = [E((names or {}).get(v, v)) if k == 1 else mul(k, (names or {}).get(v, v)) for v, k in terms]
        if const or not parts:
            parts.append(E(const))
        return add(*parts)

    def mask_of(self, v: Var, r: str | None = None) -> kir.Expr | None:
        """The lanes of tile var v's index vector (its `_r`, or r) inside its extent, where its last tile overhangs
        (below its count of valid rows, for a counted loop)."""
        if isinstance(v, Counted):
            return gathers.count_mask(self, v, r)
        return cmp(r or v.name + "_r", "<", v.extent) if v.extent % v.step else None

    def bind_tile(self, v: Var, out: list, indent: str, hint: bool = False, start: str | None = None) -> None:
        """`v_r`, the index vector of tile var v's tile, from `start` (v's own value where None)."""
        r = add(start or v.name, call("tl.arange", 0, v.step))
        if hint:  # tile starts are multiples of the step: lets Triton vectorize and pipeline the loads
            r = call("tl.max_contiguous", call("tl.multiple_of", r, v.step), v.step)
        out.append(At(indent, assign(f"{v.name}_r", r)))


def build_model(g: nx.DiGraph, schedule: str, options: dict) -> ModuleModel:
    prog = program_of(g)
    flag_no = {f.name: i + 1 for i, f in enumerate(flags(g))}
    scopes = flag_scopes(g)
    taken = _taken_names(g)
    kernels = []
    nconc = sum(1 for k in kernels_of(g) if k.concurrent) or 1
    slots = 0 if options.get("timeline") else None
    kernel_slots: list[int] = []
    for k in kernels_of(g):
        kernels.append(_kernel(g, k, flag_no, scopes, options.get("group_m", 8),
                               1.0 / nconc if k.concurrent else 1.0,
                               options.get("start_local", False), slots, options.get("attend_block", 64), taken,
                               bool(options.get("noinline_tasks")), options.get("overlap", True), len(kernels),
                               printer_for(options, prog.world)))
        if slots is not None:
            kernel_slots.append(sum(trips(stage(g, s).loops) for s in k.stages))  # folded stages record too
            slots += kernel_slots[-1]
    tensors_used = [TensorModel(t.name, t.kind, t.dtype, t.shape, t.symmetric)
                    for t in sorted(tensors(g), key=lambda t: t.name)]
    silent = silent_flags(g)
    fms = tuple(FlagModel(f.name, f"F_{ident(f.name)}", f.size, f.count, f.producer, ", ".join(f.key),
                          flag_no[f.name]) for f in flags(g) if f.name not in silent)
    header = (
        f"program: {prog.name}   world: {prog.world}   schedule: {schedule}",
        *wrap("passes: ", list(passes_run(g)), "", "", 118),
        "dims: " + " ".join(f"{k}={v}" for k, v in prog.dims) + "   tiles: " + " ".join(f"{k}={v}" for k, v in
                                                                                       prog.tiles),
        "launch: " + f"num_warps={options.get('num_warps', 4)} num_stages={options.get('num_stages', 3)}"
        f" group_m={options.get('group_m', 8)}",
    )
    uses_iris = any("iris." in ln for km in kernels for ln in (*km.lines, *(x for f in km.tasks for x in f.lines)))
    return ModuleModel(header, prog.file, prog.name, prog.world, schedule, tuple(tensors_used), fms, tuple(kernels),
                       options.get("num_warps", 4), options.get("num_stages", 3), _peers_touch_user_tensors(g),
                       slots or 0, tuple(kernel_slots), bool(options.get("noinline_tasks")), uses_iris,
                       table_lines(g), **backend_fields(options, prog.world))


def _peers_touch_user_tensors(g: nx.DiGraph) -> bool:
    """Whether, after the last barrier, a rank reads or writes another rank's copy of an `in`/`out` tensor. Then
    a call must end with a barrier, or a fast rank could overwrite its inputs while a peer still reads them."""
    last: list = []
    for n in node_order(g):
        last = [] if kind_of(g, n) == "barrier" else [*last, payload_of(g, n)]
    for st in last:
        for r in st.reads():
            a = r.source if isinstance(r, Pull) else r.access
            # a pull reads its source on the rank that ran the copy: a peer when the buffer read was remote
            remote = a.remote or (isinstance(r, Pull) and r.read.remote)
            if remote and tensor(g, a.tensor).kind != "buf":
                return True
        if any(s.access.remote and tensor(g, s.access.tensor).kind != "buf" for s in st.body):
            return True
    return False


def _kernel(g: nx.DiGraph, k: Kernel, flag_no: dict[str, int], scopes: dict[str, str], group_m: int, share: float,
            start_local: bool, timeline_base: int | None, attend_block: int, taken: set[str],
            noinline: bool, overlap: bool = True, index: int = 0, pr: Printer | None = None) -> KernelModel:
    params: list[str] = []
    tasks: list[tuple[str, list[str], list[str]]] = []  # (task function, its buffers, its lines)
    world = program_of(g).world
    offset = 0  # timeline slots: every stage's tasks, folded ones included (they still record)
    folded = {fo.consumer for fo in folds(g)}  # run by their producer's tasks (fold-last), not by the loop
    looped = [s for s in k.stages if s not in folded]
    shares = tuple(x for s, x in zip(k.stages, k.groups, strict=True) if s not in folded) if k.groups else ()
    total = sum(stage(g, s).tasks(world) for s in looped)
    at_task = 0
    pre: list[kir.Stmt] = []  # the entry's statements before the task loop
    if shares:  # program group i covers pids [lo_i, lo_i + n_i); every group has at least one program
        cum = [sum(shares[:i]) for i in range(len(shares) + 1)]
        bounds = ["0"] + [f"{s}_first" for s in looped[1:]] + ["NPROG"]
        pre.append(kir.Comment(f"workgroup specialization: programs per stage in proportion"
                               f" {', '.join(map(str, shares))}"))
        for i, s in enumerate(looped[1:], 1):
            pre.append(assign(bounds[i], add(i, fdiv(mul(sub("NPROG", len(shares)), cum[i]), cum[-1])),
                              f"the first program of stage {s}"))
    plan = overlap_plan(g, k, group_m, lambda st: st.tasks(world)) if overlap and not folded else None
    keep: dict[str, frozenset[str]] = {}  # per task function: the names a reader looks for (rewrites.simplify)
    # per looped stage: (its task function, the task number it passes, the stage's tasks, its body, its name)
    runs: list[tuple[str, kir.Expr, int, tuple[kir.Stmt, ...], str]] = []
    for sname in k.stages:
        st = stage(g, sname)
        vs = {v.name for v in st.loops} | {x.var.name for s in st.body for x in walk(s.value) if isinstance(x, Sum)}
        keep[f"{sname}_task"] = frozenset(vs | {f"{v}_r" for v in vs})
        n = st.tasks(world)
        em = _Emitter(g, st, flag_no, scopes, attend_block, taken)
        # every task its own running program when the grid is this large (persistent grids are sized to what is
        # co-resident): then a fold's last arrivals may share its consumer tasks (flags.arrive)
        em.all_running = total if k.persistent and not shares else None
        has_sum = any(isinstance(x.value, Sum) for x in st.body)
        mark = None if timeline_base is None else (timeline_base + offset, [x.name for x in stages(g)].index(sname))
        gm = plan.group_m if plan is not None and sname == plan.consumer else group_m
        own_first = own_rows_first(g, st, group_m) if overlap and plan is None and k.persistent else None
        if own_first is not None and sname not in folded:  # this rank's rows first (order.py), while the copy
            gm, rotate = own_first, (lambda t, n: _rotated(t, n, True, world, always=True))  # moves the peers'
        elif overlap and plan is None and not start_local and sname not in folded and own_rows_last(g, k, st):
            # pushes to each rank in turn, this rank's own last (order.py): no rank's consumer waits on a peer's
            # last tiles
            rotate = (lambda t, n: mod(add(t, mul(add("rank", 1), n // world)), n))
        else:
            rotate = (lambda t, n: _rotated(t, n, start_local, world))
        # a folded stage's task number is computed by its producer in plain order (no grouped decode)
        body = assemble(_task_body(em, st, gm if has_sum and sname not in folded else 1, mark, world), 4)
        fn_name = f"{sname}_task"
        if len(k.stages) > 1:
            tasks.append((fn_name, list(em.params), body))
        offset += n
        for p in em.params:
            if p not in params:
                params.append(p)
        if sname in folded:
            continue
        first = E("task") if shares or not at_task else sub("task", at_task)
        runs.append((fn_name, rotate(first, n), n, body, sname))
        at_task += n
    args = [param_name(p) for p in params] + list(TASK_ARGS)

    def run(fn_name: str, first: kir.Expr) -> kir.Stmt:
        return kir.Do(call(fn_name, first, *args))

    if shares:
        branches = []
        for i, (fn_name, first, n, _body, sname) in enumerate(runs):
            lo, hi = bounds[i], bounds[i + 1]
            loop = kir.For("task", sub("pid", lo), E(n), sub(hi, lo), (run(fn_name, first),))
            branches.append((cmp("pid", "<", hi) if i == 0 or i < len(runs) - 1 else None, (loop,), f"stage {sname}"))
        loop_body = _chain(branches)
    elif plan is not None:
        loop_body = _overlapped(g, plan, start_local, world, run)
    elif len(k.stages) == 1:
        fn_name, first, n, body, _s = runs[0]
        loop_body = (assign("t", first), *body)
    elif len(runs) == 1:  # the kernel's other stages are folded into this one
        loop_body = (run(runs[0][0], runs[0][1]),)
    else:
        ends = [sum(r[2] for r in runs[:i + 1]) for i in range(len(runs))]
        loop_body = _chain([(cmp("task", "<", ends[i]) if i < len(runs) - 1 else None, (run(fn_name, first),), "")
                            for i, (fn_name, first, _n, _b, _s) in enumerate(runs)])
    entry_body = [*([assign("pid", call("tl.program_id", 0))] if shares else []),
                  assign("epoch", call("enter", "epoch", "EPOCH_AT", "GRAPH", "PDL")), *pre]
    if shares:
        entry_body += loop_body
    else:  # the task loop may claim its tasks from this kernel's counter (EPOCH[2 + 2i], launch: CLAIM)
        entry_body.append(kir.For("task", call("tl.program_id", 0), E(total), E("NPROG"), tuple(loop_body),
                                  claim=add("EPOCH_AT", 2 + 2 * index)))
    entry_body.append(kir.Do(call("leave", "EPOCH_AT", "epoch", "NPROG", "GRAPH")))
    entry = kir.Fn(k.name, tuple(kir.Param(p) for p in args[:-2]) + (
        kir.Param("timeout_ns"), kir.Param("EPOCH_AT"), kir.Param("NPROG", True), kir.Param("INTERPRET", True),
        kir.Param("GRAPH", True), kir.Param("PDL", True), kir.Param("CLAIM", True, "False")), tuple(entry_body))
    fns = tuple(kir.Fn(name, (kir.Param("t"), *(kir.Param(a) for a in args[:-1]), kir.Param("INTERPRET", True)),
                       _with_args(body, args)) for name, _p, body in tasks)
    pr = pr or Printer()
    kern = pr.prepare(kir.Kernel(entry, fns))
    if world == 1:  # one rank: every `rank` is 0
        kern = bind_constants(kern, {"rank": 0})
    kern = simplify(kern, {**keep, kern.entry.name: frozenset().union(*keep.values())})
    kern = rename(kern, range_names({v for ks in keep.values() for v in ks if not v.endswith("_r")}))
    kern = order_waits(kern)
    tfs = tuple(TaskFn(f.name, tuple(pr.signature(f)), tuple(pr.body(f.body, "    "))) for f in kern.tasks)
    name = kern.entry.name  # the printer's (the NVSHMEM printer names kernels that call NVSHMEM *_nvshmem)
    head = f"    ({name}, {total}, {k.persistent}, {k.concurrent}, {k.barrier_before}, {share}, {len(shares)}, "
    row = wrap(head + "[", [json.dumps(p) for p in params], "]),", "    ")
    if len(row) > 1:  # the buffers on lines of their own
        row = [head.rstrip(), *wrap("     [", [json.dumps(p) for p in params], "]),", "     ")]
    return KernelModel(name, k.stages, tuple(params), tuple(pr.signature(kern.entry)),
                       tuple(pr.body(kern.entry.body, "    ")), total, k.persistent, k.concurrent,
                       k.barrier_before, share, len(shares), tfs, tuple(row))


def _with_args(body: tuple[kir.Stmt, ...], args: list[str]) -> tuple[kir.Stmt, ...]:
    """A folded consumer's call inside its producer's task (flags.arrive) takes the kernel's arguments."""
    def spread(e: kir.Expr) -> kir.Expr:
        if isinstance(e, kir.Call) and kir.Name(TASK_ARGS_MARK) in e.args:
            i = e.args.index(kir.Name(TASK_ARGS_MARK))
            return kir.Call(e.fn, (*e.args[:i], *(kir.Name(a) for a in args), *e.args[i + 1:]))
        return e

    return kir.map_exprs(body, spread)


def _chain(branches: list[tuple[kir.Expr | None, tuple[kir.Stmt, ...], str]]) -> tuple[kir.Stmt, ...]:
    """if / elif / else over (condition, body, comment) branches, the last one's condition None: its `else`."""
    cond, body, comment = branches[0]
    if len(branches) == 1:
        return body if cond is None else (kir.If(cond, body, (), comment),)
    rest = _chain(branches[1:])
    if branches[1][0] is None:  # the else
        return (kir.If(cond, body, rest, comment, else_comment=branches[1][2]),)
    return (kir.If(cond, body, (replace(rest[0], elif_=True),), comment),)


def _rotated(t: kir.Expr, n: int, on: bool, world: int, always: bool = False) -> kir.Expr:
    """start_local: rank q starts its stage's tasks at q/W of the way round (its own rows, its own shard first),
    so programs do not all begin by waiting on the same peer; every task is still run exactly once. always: this
    rank's rows first in any case (order.own_rows_first)."""
    if not always and (not on or world == 1 or n < world):
        return t
    return mod(add(t, mul("rank", n // world)), n)


def _overlapped(g: nx.DiGraph, p: Overlap, start_local: bool, world: int, run) -> tuple[kir.Stmt, ...]:
    """The loop body of an interleaved kernel (order.py): copies spread among this rank's own tiles, then the
    peers' tiles. The first p.head tasks are this rank's own tiles with the copies among them, under a static
    stride each program's share of that mix one stretch (td.program_major), claimed tasks in task order; the tasks
    after them are the peers' tiles (at = task, every copy before it). copy_order sends the copies to the peers in
    the order they read them."""
    cp, c = stage(g, p.copy), stage(g, p.consumer)
    copied = E("copied")
    copy = _rotated(copied, p.copies, start_local, world) if start_local else copy_order(copied, g, p, world)
    own_first = mod(add(sub("at", "copied"), mul("rank", p.own)), p.tiles)  # the consumer rotated: own rows first
    is_copy = _both(cmp("at", "<", p.head), cmp(fdiv(mul(add("at", 1), p.copies), p.head), ">", "copied"))
    return (assign("at", call("td.program_major", "task", p.head, "NPROG", "CLAIM"),
                   f"own {c.name} tiles (no waits) with the copies, then the peers'"),
            assign("copied", call("tl.minimum", fdiv(mul("at", p.copies), p.head), p.copies),
                   "copies before this task"),
            kir.If(is_copy, (run(f"{cp.name}_task", copy),),
                   (run(f"{c.name}_task", own_first),)))


def _both(a: kir.Expr, b: kir.Expr) -> kir.Expr:
    """a & b of two conditions (scalars: Triton's `and` of tensors is `&`)."""
    return kir.Bin("&", a, b)


def _task_body(em: _Emitter, st, group_m: int, mark, world: int) -> list:
    """The lines of one task of stage st, task number `t` among the tasks it runs (a stage that skips its rank loop's
    own value counts only the peers: Tasks.decode)."""
    return em.task("t", group_m, mark)
