"""Rule folds (fold-last): a folded consumer runs inside the producer task that completes its group, so
every consumer task runs exactly once, in the group whose counter its waits cover, inside the same persistent
kernel, and waits on nothing else.
"""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np

from tilec.errors import ScheduleError
from tilec.ir import peers, regions
from tilec.ir.graph import Stage, folds
from tilec.ir.regions import Undecidable
from tilec.ir.tiling import strides
from tilec.ir.types import ME

from .context import Ctx, stage_waits, waited


def check(ctx: Ctx) -> None:
    """fold-last: the consumer runs inside the producer task that completes a group, with no wait of its own, so
    every consumer task must run exactly once, in the group whose counter its waits cover (one counter per task),
    inside the same persistent kernel, and wait on nothing else (an inlined wait could block its producer)."""
    from tilec.ir.graph import Fold
    from tilec.ir.wait_plan import fold_reads, plan_fold

    seen: set[str] = set()
    for fo in folds(ctx.g):
        if not isinstance(fo, Fold):
            ctx.err(None, "the fold list holds something that is not a fold")
            continue
        f = ctx.flags.get(fo.flag)
        if fo.consumer not in ctx.pos or fo.producer not in ctx.pos or f is None:
            ctx.err(fo.loc, f"fold of stage '{fo.consumer}' into '{fo.producer}' names an unknown stage or flag")
            continue
        c = ctx.stages[ctx.pos[fo.consumer]]
        what = f"stage '{fo.consumer}' folded into stage '{fo.producer}'"
        if fo.consumer in seen or fo.consumer == fo.producer or f.producer != fo.producer:
            ctx.err(fo.loc, f"{what}: folded twice, into itself, or on a flag ({fo.flag}) another stage releases")
            continue
        seen.add(fo.consumer)
        k = ctx.kernel_of.get(fo.consumer)
        ks = ctx.kernels or ()
        if k is None or k != ctx.kernel_of.get(fo.producer) or not ks[k].persistent or \
                ks[k].stages.index(fo.producer) > ks[k].stages.index(fo.consumer):
            ctx.err(fo.loc, f"{what}: not an earlier stage of the same persistent kernel")
            continue
        if ctx.world > 1 and (f.write.rank != ME or any(a.rank != ME for a, _ in f.also)):
            ctx.err(fo.loc, f"{what}: {fo.flag} counts stores into peers; the last arrival is not on this GPU")
            continue
        ws = stage_waits(ctx.g, fo.consumer)
        other = next((w for w in ws if w.flag != fo.flag or (w.read.rank != ME and ctx.world > 1)), None)
        if other is not None:
            ctx.err(other.loc, f"{what}: it also waits on {other.flag} before reading {other.read}; run inside its"
                               " producer's task that wait could block the producer")
            continue
        if any((fo.flag, t) not in ctx.flag_info for t in f.tensors) or \
                any(w.tensor not in f.tensors or w.read.tensor != w.tensor for w in ws):
            continue  # the flag or the wait itself is rejected (rules flags and waits)
        try:
            plan = plan_fold(ctx.g, fo)
            why = _fold_groups(ctx, c, fo, plan, fold_reads(ctx.g, fo.consumer, fo.flag))
        except (ScheduleError, Undecidable) as e:
            why = f"{e}; rejected rather than trusted"
        if why:
            ctx.err(fo.loc, f"{what}: {why}")


def fold_problem(g: nx.DiGraph, fo) -> str | None:
    """Why fold `fo` of graph g is unsound (its groups, as _folds checks them), or None: fold-last asks before it
    commits to a fold."""
    from tilec.ir.wait_plan import fold_reads, plan_fold

    ctx = Ctx(g)
    ctx.setup()
    try:
        return _fold_groups(ctx, ctx.stages[ctx.pos[fo.consumer]], fo, plan_fold(g, fo),
                            fold_reads(g, fo.consumer, fo.flag))
    except (ScheduleError, Undecidable) as e:
        return str(e)


def _fold_groups(ctx: Ctx, c: Stage, fo, plan, reads) -> str | None:
    from tilec.ir.queries import flag_dims
    from tilec.ir.wait_plan import plan_wait

    if ctx.stages[ctx.pos[fo.producer]].skip_equal:  # the groups below count every producer task
        return (f"stage '{fo.producer}' skips some of its tasks (local-in-place), so a group's last arrival may never"
                " come")
    sc = ctx.scope(c)
    order = [v for v in c.loops if v.trips > 1]
    env = regions.grid(order, f"the tasks of stage '{c.name}'")
    n = peers.combinations(env)
    tno = np.zeros(n, dtype=np.int64)
    for v in order:
        tno = tno * v.trips + env[v.name] // v.step
    if plan.order != tuple(order) or sorted(tno.tolist()) != list(range(n)):
        return "its task numbers are not the plain decode order"
    counter = None
    for w, red in reads:  # the one counter each task waits on, the same for every read
        fw = ctx.flags[fo.flag].member(w.tensor)
        wp = plan_wait(ctx.g, fw, w.read, red, sc, "gpu")
        dims = flag_dims(ctx.g, fw)
        st = dict(zip((d.dim for d in dims), strides(dims), strict=True))
        mine = np.zeros(n, dtype=np.int64)
        for r in wp.reach:
            if any(v not in env and sc[v].trips > 1 for v, _ in r.terms):
                return f"its read {w.read} picks counters by a reduction"
            full = {v: env.get(v, np.zeros(n, dtype=np.int64)) for v in sc}
            first, last = waited(r, full, n)
            if (first != last).any():
                i = int(np.flatnonzero(first != last)[0])
                return f"its task {int(tno[i])} waits on counters {first[i]}..{last[i]} of dim {r.dim.dim} before" \
                       f" reading {w.read}: more than one group"
            mine += first * st[r.dim.dim]
        if counter is not None and (mine != counter).any():
            return f"its reads wait on different counters of {fo.flag} in one task"
        counter = mine
    by_task = dict(zip(tno.tolist(), counter.tolist(), strict=True))
    # the producer side, as emitted: the counter a producer task bumps and the consumer tasks it then runs
    p = ctx.stages[ctx.pos[fo.producer]]
    pl = ctx.loops(p)
    if any(fd.dim.rank_var == ME for fd in plan.dims):
        return "a group is picked by the producer's rank"
    pvars = sorted({x for fd in plan.dims for x in (fd.dim.rank_var, fd.dim.tile_var) if x})
    penv = regions.grid([pl[v] for v in pvars], f"the groups of {fo.flag}")
    pn = len(next(iter(penv.values()))) if penv else 1
    pst = dict(zip((d.dim for d in plan.flag_dims), strides(list(plan.flag_dims)), strict=True))
    runs: dict[int, int] = {}
    groups: dict[int, frozenset] = {}
    for i in range(pn):
        vals = {v: int(penv[v][i]) for v in pvars}
        ctr, ranges = 0, {}
        for fd in plan.dims:
            d = fd.dim
            rv, tv = vals.get(d.rank_var, 0), vals.get(d.tile_var, 0)
            ctr += int(d.lin_of(rv, tv // d.step if d.tile_var else 0)) * pst[d.dim]
            ranges[fd.var.name] = fd.var_range(*fd.producer_span(rv, tv))
        for v in plan.free:
            ranges[v.name] = range(0, v.extent, v.step)
        tasks = frozenset(plan.task_number(dict(zip(ranges, combo, strict=True)))
                          for combo in itertools.product(*ranges.values()))
        if groups.setdefault(ctr, tasks) != tasks:
            return f"producer tasks of counter {ctr} of {fo.flag} would run different consumer tasks"
    for ctr, tasks in groups.items():
        for t in tasks:
            if t not in by_task:
                return f"the group of counter {ctr} would run task {t}, which the stage does not have"
            if by_task[t] != ctr:
                return f"task {t} waits on counter {by_task[t]} but runs when counter {ctr} completes"
            runs[t] = runs.get(t, 0) + 1
    missed = next((t for t in range(n) if runs.get(t, 0) != 1), None)
    if missed is not None:
        return f"its task {missed} runs {runs.get(missed, 0)} times per call, not once"
    return None
