"""Emitting flags: a consumer's waits on its producers' counters, a producer's releases, and their memory scopes."""

from __future__ import annotations

import networkx as nx

from tilec.ir.graph import Flag, Fold, flags, folds, stages, waits
from tilec.ir.queries import flag_dims
from tilec.ir.tiling import DimInverse, strides
from tilec.ir.types import ME, trips
from tilec.ir.wait_plan import plan_fold, plan_wait

from . import kir as K
from .build import At, Block, E, S, add, call, cmp, fdiv, mod, mul, sub
from .text import ident

TASK_ARGS_MARK = "_tilec_task_args_"  # where a folded consumer's call takes the kernel's arguments (emit._kernel)
MAX_SHARE = 32  # a fold's consumer tasks are shared by at most this many of its last arrivals


class Flags:
    """Mixin of _Emitter (emit.py): flag waits (first thing in a task, covering what its reductions read) and
    releases (after all of a task's stores), built as kernel-IR nodes (build.py)."""

    def wait(self, w, out: list, indent: str) -> None:
        f: Flag = self.fl[w.flag]
        read = w.read
        if any(fo.flag == f.name and fo.consumer == self.st.name for fo in folds(self.g)):
            return  # folded: the task that completed the group runs this one (arrive)
        # Waits go at the start of the task and cover everything its reductions will read, so the reduction
        # loop stays free of spins (Triton pipelines its loads only then).
        plan = plan_wait(self.g, f, read, self.loop_vars, self.scope, self.flag_scope[f.name])
        if plan.key in self.waited:  # an earlier wait of this task covers these counters
            return
        self.waited.add(plan.key)
        fp = self.param(f"F_{ident(f.name)}")
        owner = plan.owner
        b = Block()
        b.add(K.Comment(f"wait until stage {f.producer} has written the tiles of {read} this call"))
        if owner in self.loop_vars:  # read on every rank of a `sum r in ranks`: wait on each owner up front
            b.open_for(owner, 0, self.world)
        spans = []  # per keyed dim: its first counter, and its last (None: the read reaches one counter)
        for r in plan.reach:
            lo = self.scalar(r.terms, r.const)
            if not isinstance(lo, K.Name):  # the read's first element, named once
                first_el, lo = lo, E(self.tmp("lo"))
                b.add(K.Assign(lo, first_el))
            if r.count == 1:  # every element the task reads lies in one counter of this dim: no loop
                spans.append((_lin(r.dim, lo), None))
                continue
            last = E(self.tmp("last"))
            b.add(K.Assign(last, _lin(r.dim, sub(add(lo, *_top(r)), 1) if r.tile else add(lo, r.fixed))))
            spans.append((_lin(r.dim, lo), last))
        idx_parts, mask = [], None
        for i, (r, (first, last)) in enumerate(zip(plan.reach, spans, strict=True)):
            if last is None and i != plan.block_dim:
                idx_parts.append(first if r.stride == 1 else mul(first, r.stride))
                continue
            fvar = self.tmp("ctr")
            if i == plan.block_dim:  # one block of atomics per poll; the chunk loop nearly always runs once
                b.open_for(fvar, first, add(last, 1), plan.block)
                b.add(K.Assign(E(f"{fvar}_v"), add(fvar, call("tl.arange", 0, plan.block))))
                mask = cmp(f"{fvar}_v", "<=", last)
                fvar = f"{fvar}_v"
            else:
                b.open_for(fvar, first, add(last, 1))
            idx_parts.append(E(fvar) if r.stride == 1 else mul(fvar, r.stride))
        idx = add(*idx_parts) if idx_parts else K.Const(0)
        tail = (S(self.flag_scope[f.name]), E("INTERPRET"))
        target = mul("epoch", f.count)
        if mask is None:
            b.add(K.Do(call("wait", add(fp, idx), target, "rank", owner, "heap_bases", "ERR", "timeout_ns",
                            self.flag_no[f.name], idx, *tail)))
        else:
            b.add(K.Do(call("wait_all", fp, idx, mask, target, "rank", owner, "heap_bases", "ERR", "timeout_ns",
                            self.flag_no[f.name], *tail)))
        self.wait_lines += [At("    ", x) for x in b.done()]

    def release(self, f: Flag, out: list, indent: str) -> None:
        fp = self.param(f"F_{ident(f.name)}")
        owner = "rank" if f.write.rank == ME else f.write.rank
        out.append(At(indent, K.Do(call("release", add(fp, self._counter(f)), "rank", owner, "heap_bases",
                                        S(self.flag_scope[f.name])))))

    def arrive(self, fold: Fold, f: Flag, out: list, indent: str) -> None:
        """fold-last: bump the group's arrival counter; the bump that completes it runs the consumer's tasks of
        the group (a range of the consumer var that picks each keyed dim, every value of its other vars). When
        every task of the kernel has a running program of its own, the group's last `share` arrivals split those
        tasks between them (task number mod share), each but the last first waiting for the group: the merges of
        a decode's KV head then run side by side instead of one after another in the last split."""
        plan = plan_fold(self.g, fold)
        share = fold_share(self.g, fold, f, plan) if self.all_running else 1
        left = None
        b = Block()
        target = mul("epoch", f.count)
        if f.count == 1:  # a group of one task: no counter, it runs them itself (silent_flags: none allocated)
            b.add(K.Do(call("tl.debug_barrier"),
                       f"every thread's stores are done before {fold.consumer}'s tasks read the tile, right here"))
        elif share == 1:
            fp = self.param(f"F_{ident(f.name)}")
            b.add(K.Comment(f"the last of the {f.count} {f.producer} tasks of this group runs {fold.consumer}'s"
                            " tasks that read them"))
            b.open_if(call("arrive", add(fp, self._counter(f)), target))
        else:
            fp = self.param(f"F_{ident(f.name)}")
            counter, left, n = self._counter(f), E(self.tmp("left")), E(self.tmp("share"))
            b.add(K.Comment(f"the last {share} of the group's {f.count} {f.producer} tasks share {fold.consumer}'s"
                            f" tasks (the last runs all where < {self.all_running} programs)"),
                  K.Assign(left, call("arrive_left", add(fp, counter), target), "arrivals still to come"),
                  K.Assign(n, call("tl.where", cmp(call("tl.num_programs", 0), ">=", self.all_running), share, 1)))
            b.open_if(cmp(left, "<", n))
            b.add(K.If(cmp(left, ">", 0), (K.Do(call(
                "wait", add(fp, counter), target, "rank", "rank", "heap_bases", "ERR", "timeout_ns",
                self.flag_no[f.name], counter, S(self.flag_scope[f.name]), "INTERPRET")),),
                comment="the others wait for the whole group first"))
        names: dict[str, str] = {}
        steps: list[tuple[str, K.Expr, K.Expr | None, int | None]] = []  # (var, first, stop or None: one value, step)
        for fd in plan.dims:
            d, v, k, c = fd.dim, fd.var, fd.coef, fd.const
            e0 = add(d.const, *([mul(d.rank_coef, d.rank_var)] if d.rank_var else []),
                     *([d.tile_var] if d.tile_var else []))
            if not d.tile_var:
                span: K.Expr = K.Const(1)
            elif d.extent % d.step:
                span = call("tl.minimum", d.step, sub(d.extent, d.tile_var))
            else:
                span = E(d.step)
            e1 = add(e0, span)
            # the values of v whose read starts in [e0, e1): ceil((e - c) / k), clipped to v's range
            lo, hi = (e0, e1) if c == 0 else (call("tl.maximum", sub(e0, c), 0), call("tl.maximum", sub(e1, c), 0))
            if k != 1:
                lo, hi = fdiv(add(lo, k - 1), k), fdiv(add(hi, k - 1), k)
            if v.step != 1:
                lo = mul(fdiv(add(lo, v.step - 1), v.step), v.step)
            e1_max = d.const + (max(0, d.rank_coef * (d.world - 1)) if d.rank_var else 0) + \
                (d.extent if d.tile_var else 1)
            clipped = -(-max(e1_max - c, 0) // k) > v.extent
            if clipped:
                hi = call("tl.minimum", hi, v.extent)
            names[v.name] = self.tmp(v.name)
            if span == K.Const(1) and k == 1 and c == 0 and v.step == 1 and not clipped:
                steps.append((names[v.name], e0, None, None))  # one value
                continue
            steps.append((names[v.name], lo, hi, v.step if v.step != 1 else None))
        for v in plan.free:
            names[v.name] = self.tmp(v.name)
            steps.append((names[v.name], K.Const(0), E(v.extent), v.step if v.step != 1 else None))
        # the consumer's task number: its vars in decode order, the last fastest; where that last var is the innermost
        # loop (unit step), the loop runs over the task numbers themselves
        order = list(plan.order)
        last = order[-1] if order and steps and steps[-1][0] == names[order[-1].name] and steps[-1][2] is not None \
            and steps[-1][3] is None and order[-1].step == 1 else None
        t: K.Expr | None = None
        for v in order[:-1] if last else order:
            x = E(names[v.name]) if v.step == 1 else fdiv(names[v.name], v.step)
            t = x if t is None else add(mul(t, v.trips), x)
        for var, lo, hi, step in steps[:-1] if last else steps:
            if hi is None:
                b.add(K.Assign(E(var), lo))
            else:
                b.open_for(var, lo, hi, step)
        if last:
            base = [] if t is None else [mul(t, last.trips)]
            t = E(self.tmp(f"t_{fold.consumer}"))
            b.open_for(t.id, add(*base, steps[-1][1]), add(*base, steps[-1][2]))
        t = K.Const(0) if t is None else t
        if left is not None:
            if not last:
                tn = E(self.tmp("t"))
                b.add(K.Assign(tn, t))
                t = tn
            b.open_if(cmp(mod(t, n), "==", left))
        b.add(K.Do(call(f"{fold.consumer}_task", t, TASK_ARGS_MARK)))
        out += [At(indent, x) for x in b.done()]

    def _counter(self, f: Flag) -> K.Expr:
        """The counter of flag f a task of its producer bumps (from the task's own vars)."""
        dims = flag_dims(self.g, f)
        st = strides(dims)
        parts = []
        for d, s in zip(dims, st, strict=True):
            if d.size == 1:
                continue
            r = E(d.rank_var if d.key_rank else 0)
            t = fdiv(d.tile_var, d.step) if d.key_tile else K.Const(0)
            lin = _lin_of(d, r, t)
            parts.append(lin if s == 1 else mul(lin, s))
        return add(*parts) if parts else K.Const(0)

    # -- one task ----------------------------------------------------------------------------------


def fold_share(g: nx.DiGraph, fold, f: Flag, plan=None) -> int:
    """How many of a fold's last arrivals share its consumer tasks where every task of the kernel has a running
    program (Flags.arrive): at most the group's arrivals, its consumer tasks and MAX_SHARE. All but the last of
    them wait for the group (tilec taxes counts those waits)."""
    return min(f.count, _per_group(plan or plan_fold(g, fold)), MAX_SHARE)


def _per_group(plan) -> int:
    """How many consumer tasks one group of a fold runs (a group whose span is off the consumer's grid may run one
    more per dim): per keyed dim the consumer var's values whose read starts in the group's span, times every
    value of the consumer's other vars. Only how evenly the shares split depends on it."""
    n = 1
    for fd in plan.dims:
        span = fd.dim.step if fd.dim.tile_var else 1
        n *= -(-span // (fd.coef * fd.var.step))
    return n * trips(plan.free)


def silent_flags(g: nx.DiGraph) -> set[str]:
    """Fold flags whose groups are one producer task: that task runs its consumers with no counter (flags.arrive),
    so none is allocated or bumped."""
    return {fo.flag for fo in folds(g) if any(f.name == fo.flag and f.count == 1 for f in flags(g))}


def flag_scopes(g: nx.DiGraph) -> dict[str, str]:
    """Memory scope of each flag's release and acquires: "gpu" when every release and every wait is on the
    rank's own counter (producer and consumer share the GPU), else "sys" (a peer GPU writes or reads it, over
    NVLink: only a system-scope release orders the data before the counter there)."""
    local = {f.name for f in flags(g) if f.write.rank == ME}
    for s in stages(g):
        for w in waits(g, s.name):
            if w.read.rank != ME:
                local.discard(w.flag)
    return {f.name: "gpu" if f.name in local else "sys" for f in flags(g)}


def _top(r) -> tuple[K.Expr, ...]:
    """How far a read reaches beyond its first element, less one, as terms of a sum (wait_plan.Reach.top): the
    fixed reach and the tile's extent in this task (a ragged last tile reaches less)."""
    v = r.tile
    span = call("tl.minimum", v.step, sub(v.extent, v.name)) if v.extent % v.step else E(v.step)
    return (E(r.fixed), span)


def _lin(d: DimInverse, e: K.Expr) -> K.Expr:
    x = sub(e, d.const) if d.const else e
    if d.rank_var and d.key_rank and d.key_tile and d.rank_coef == d.trips * d.step:
        # a rank's block is whole tiles: (x // coef) * trips + (x % coef) // step is x // step (x >= 0: the wait
        # covers elements its producer writes)
        return fdiv(x, d.step)
    if d.rank_var and d.rank_coef < 0:  # a reversed order: its counters count the ranks from the last (lin_of)
        x = add(x, -d.rank_coef * (d.world - 1))
        r = fdiv(x, -d.rank_coef)
        off = sub(x, mul(-d.rank_coef, r))
        t = fdiv(off, d.step) if d.tile_var and d.key_tile else K.Const(0)
        return _lin_of(d, r if d.key_rank else K.Const(0), t, counted=True)
    if d.rank_var:
        r = fdiv(x, d.rank_coef)
        off = sub(x, mul(d.rank_coef, r))
    else:
        r, off = K.Const(0), x
    t = fdiv(off, d.step) if d.tile_var and d.key_tile else K.Const(0)
    return _lin_of(d, r if d.key_rank else K.Const(0), t)


def _lin_of(d: DimInverse, r: K.Expr, t: K.Expr, counted: bool = False) -> K.Expr:
    """The counter coordinate of rank value r and tile number t (DimInverse.lin_of); counted: r is already
    counted from the last rank where the order is reversed."""
    if d.key_rank and d.rank_var and d.rank_coef < 0 and not counted:
        r = sub(d.world - 1, r)
    parts = []
    if d.key_rank:
        parts.append(mul(r, d.trips) if d.key_tile and d.trips != 1 else r)
    if d.key_tile:
        parts.append(t)
    return add(*parts) if parts else K.Const(0)
