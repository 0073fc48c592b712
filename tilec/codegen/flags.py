"""Emitting flags: a consumer's waits on its producers' counters, a producer's releases, and their memory scopes."""

from __future__ import annotations

import networkx as nx

from tilec.ir.graph import Flag, Fold, flags, folds, stages, waits
from tilec.ir.queries import flag_dims
from tilec.ir.tiling import DimInverse, strides
from tilec.ir.types import ME, trips
from tilec.ir.wait_plan import plan_fold, plan_wait

from .text import ident

TASK_ARGS_MARK = "_tilec_task_args_"  # where a folded consumer's call takes the kernel's arguments (emit._kernel)
MAX_SHARE = 32  # a fold's consumer tasks are shared by at most this many of its last arrivals


class Flags:
    """Mixin of _Emitter (emit.py): flag waits (first thing in a task, covering what its reductions read) and
    releases (after all of a task's stores)."""

    def wait(self, w, out: list[str], indent: str) -> None:
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
        target_lines, ind = self.wait_lines, "    "
        fp = self.param(f"F_{ident(f.name)}")
        owner = plan.owner
        target_lines.append(f"{ind}# wait until stage {f.producer} has written the tiles of {read} this call")
        if owner in self.loop_vars:  # read on every rank of a `sum r in ranks`: wait on each owner up front
            target_lines.append(f"{ind}for {owner} in range(0, {self.world}):")
            ind += "    "
        spans = []  # per keyed dim: its first and last counter
        for r in plan.reach:
            lo = self.scalar(list(r.terms), r.const)
            if not lo.isidentifier():  # the read's first element, named once
                lo, first_el = self.tmp("lo"), lo
                target_lines.append(f"{ind}{lo} = {first_el}")
            last = self.tmp("last")
            target_lines.append(f"{ind}{last} = {_lin(r.dim, f'({lo} + {r.top})')}")
            spans.append((_lin(r.dim, lo), last))
        idx_parts, mask = [], None
        for i, (r, (first, last)) in enumerate(zip(plan.reach, spans, strict=True)):
            fvar = self.tmp("ctr")
            if i == plan.block_dim:  # one block of atomics per poll; the chunk loop nearly always runs once
                target_lines.append(f"{ind}for {fvar} in range({first}, {last} + 1, {plan.block}):")
                ind += "    "
                target_lines.append(f"{ind}{fvar}_v = {fvar} + tl.arange(0, {plan.block})")
                mask = f"{fvar}_v <= {last}"
                fvar = f"{fvar}_v"
            else:
                target_lines.append(f"{ind}for {fvar} in range({first}, {last} + 1):")
                ind += "    "
            idx_parts.append(fvar if r.stride == 1 else f"{fvar} * {r.stride}")
        idx = " + ".join(idx_parts) or "0"
        tail = f"\"{self.flag_scope[f.name]}\", INTERPRET)"
        if mask is None:
            target_lines.append(f"{ind}td.wait({fp} + {idx}, epoch * {f.count}, rank, {owner}, heap_bases, ERR,"
                                f" timeout_ns, {self.flag_no[f.name]}, {idx}, {tail}")
        else:
            target_lines.append(f"{ind}td.wait_all({fp}, {idx}, {mask}, epoch * {f.count}, rank, {owner},"
                                f" heap_bases, ERR, timeout_ns, {self.flag_no[f.name]}, {tail}")

    def release(self, f: Flag, out: list[str], indent: str) -> None:
        fp = self.param(f"F_{ident(f.name)}")
        owner = "rank" if f.write.rank == ME else f.write.rank
        out.append(f"{indent}td.release({fp} + {self._counter(f)}, rank, {owner}, heap_bases,"
                   f" \"{self.flag_scope[f.name]}\")")

    def arrive(self, fold: Fold, f: Flag, out: list[str], indent: str) -> None:
        """fold-last: bump the group's arrival counter; the bump that completes it runs the consumer's tasks of
        the group (a range of the consumer var that picks each keyed dim, every value of its other vars). When
        every task of the kernel has a running program of its own, the group's last `share` arrivals split those
        tasks between them (task number mod share), each but the last first waiting for the group: the merges of
        a decode's KV head then run side by side instead of one after another in the last split."""
        plan = plan_fold(self.g, fold)
        share = fold_share(self.g, fold, f, plan) if self.all_running else 1
        left = None
        if f.count == 1:  # a group of one task: no counter, it runs them itself (silent_flags: none allocated)
            out.append(f"{indent}# {fold.consumer}'s tasks that read this tile run right here (a group of one)")
            out.append(f"{indent}tl.debug_barrier()  # every thread's stores of the tile are done before they read it")
            ind = indent
        elif share == 1:
            fp = self.param(f"F_{ident(f.name)}")
            out.append(f"{indent}# the last of the {f.count} {f.producer} tasks of this group runs {fold.consumer}'s"
                       " tasks that read them")
            out.append(f"{indent}if td.arrive({fp} + {self._counter(f)}, epoch * {f.count}):")
            ind = indent + "    "
        else:
            fp = self.param(f"F_{ident(f.name)}")
            counter, left, n = self._counter(f), self.tmp("left"), self.tmp("share")
            out += [f"{indent}# the last {share} of the {f.count} {f.producer} tasks of this group share"
                    f" {fold.consumer}'s tasks that read them",
                    f"{indent}# when all {self.all_running} tasks have a program (else the last runs them all);"
                    " the others first wait for the group",
                    f"{indent}{left} = td.arrive_left({fp} + {counter}, epoch * {f.count})  # arrivals still to come",
                    f"{indent}{n} = tl.where(tl.num_programs(0) >= {self.all_running}, {share}, 1)",
                    f"{indent}if {left} < {n}:",
                    f"{indent}    if {left} > 0:",
                    f"{indent}        td.wait({fp} + {counter}, epoch * {f.count}, rank, rank, heap_bases, ERR,"
                    f" timeout_ns, {self.flag_no[f.name]}, {counter}, \"{self.flag_scope[f.name]}\", INTERPRET)"]
            ind = indent + "    "
        names = {}
        for fd in plan.dims:
            d, v, k, c = fd.dim, fd.var, fd.coef, fd.const
            rv = f" + {d.rank_coef} * {d.rank_var}" if d.rank_var else ""
            e0 = f"{d.const}{rv}" + (f" + {d.tile_var}" if d.tile_var else "")
            if not d.tile_var:
                span = "1"
            elif d.extent % d.step:
                span = f"tl.minimum({d.step}, {d.extent} - {d.tile_var})"
            else:
                span = str(d.step)
            e1 = f"{e0} + {span}"
            # the values of v whose read starts in [e0, e1): ceil((e - c) / k), clipped to v's range
            lo, hi = (e0, e1) if c == 0 else (f"tl.maximum({e0} - {c}, 0)", f"tl.maximum({e1} - {c}, 0)")
            if k != 1:
                lo, hi = f"({lo} + {k - 1}) // {k}", f"({hi} + {k - 1}) // {k}"
            if v.step != 1:
                lo = f"({lo} + {v.step - 1}) // {v.step} * {v.step}"
            e1_max = d.const + (d.rank_coef * (d.world - 1) if d.rank_var else 0) + (d.extent if d.tile_var else 1)
            if -(-max(e1_max - c, 0) // k) > v.extent:
                hi = f"tl.minimum({hi}, {v.extent})"
            names[v.name] = self.tmp(v.name)
            if span == "1" and k == 1 and c == 0 and v.step == 1 and not hi.startswith("tl.minimum"):
                out.append(f"{ind}{names[v.name]} = {e0}")  # one value
                continue
            stride = f", {v.step}" if v.step != 1 else ""
            out.append(f"{ind}for {names[v.name]} in range({lo}, {hi}{stride}):")
            ind += "    "
        for v in plan.free:
            names[v.name] = self.tmp(v.name)
            out.append(f"{ind}for {names[v.name]} in range(0, {v.extent}{f', {v.step}' if v.step != 1 else ''}):")
            ind += "    "
        t = "0"
        for v in plan.order:
            x = names[v.name] if v.step == 1 else f"({names[v.name]} // {v.step})"
            t = x if t == "0" else f"({t}) * {v.trips} + {x}"
        if left is not None:
            tn = self.tmp("t")
            out += [f"{ind}{tn} = {t}", f"{ind}if {tn} % {n} == {left}:"]
            t, ind = tn, ind + "    "
        out.append(f"{ind}{fold.consumer}_task({t}, {TASK_ARGS_MARK})")

    def _counter(self, f: Flag) -> str:
        """The counter of flag f a task of its producer bumps (from the task's own vars)."""
        dims = flag_dims(self.g, f)
        st = strides(dims)
        parts = []
        for d, s in zip(dims, st, strict=True):
            if d.size == 1:
                continue
            r = d.rank_var if d.key_rank else "0"
            t = f"({d.tile_var} // {d.step})" if d.key_tile else "0"
            lin = _lin_of(d, r, t)
            parts.append(lin if s == 1 else f"({lin}) * {s}")
        return " + ".join(parts) or "0"

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


def _lin(d: DimInverse, e: str) -> str:
    x = f"({e} - {d.const})" if d.const else e
    if d.rank_var and d.key_rank and d.key_tile and d.rank_coef == d.trips * d.step:
        # a rank's block is whole tiles: (x // coef) * trips + (x % coef) // step is x // step (x >= 0: the wait
        # covers elements its producer writes)
        return f"({x} // {d.step})"
    if d.rank_var:
        r = f"({x} // {d.rank_coef})"
        off = f"({x} - {d.rank_coef} * {r})"
    else:
        r, off = "0", x
    t = f"({off} // {d.step})" if d.tile_var and d.key_tile else "0"
    return _lin_of(d, r if d.key_rank else "0", t)


def _lin_of(d: DimInverse, r: str, t: str) -> str:
    parts = []
    if d.key_rank:
        parts.append(f"{r} * {d.trips}" if d.key_tile and d.trips != 1 else r)
    if d.key_tile:
        parts.append(t)
    return " + ".join(parts) or "0"
