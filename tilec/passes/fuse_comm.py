"""fuse-comm: fuse the communication of tile-copy stages into their neighbours.

A copy stage moves tiles and computes nothing: `T[w(p)] = X@r[s(p)]` (T a buffer, X read on rank r).

mode=pull (the consumer reads the source directly; the buffer disappears):
  Before:  stage gather over r, m, k:  Ag[r*M/W + m, k] = A@r[m, k]     barrier
           stage gemm over m, n:       C[m, n] = sum k: Ag[m, k] @ B[k, n]
  After:   stage gemm over m, n:       C[m, n] = sum k: pull(A@r[m, k] via Ag[m, k]) @ B[k, n]
  (per element of the Ag tile the copy's variables r, m are solved from the Ag index, so tiles that straddle
  two ranks' shards are read from both.)

mode=push (the owner stores its tiles into every peer's buffer):
  Before:  stage gather over r, m, k:  Ag[r*M/W + m, k] = A@r[m, k]       (rank `rank` pulls from r)
  After:   stage gather over r, m, k:  Ag@r[rank*M/W + m, k] = A[m, k]    (rank `rank` pushes to r)
  The task that rank q ran for r = p is the task that rank p now runs for r = q: same tiles, other executor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import networkx as nx

from tilec.errors import ScheduleError
from tilec.ir import peers
from tilec.ir.gather import counted_loop
from tilec.ir.graph import (
    Pull,
    Stage,
    kind_of,
    node_order,
    payload_of,
    phases,
    program_of,
    rebuild_edges,
    set_payload,
    sid,
    stages,
    tid,
    update_state,
)
from tilec.ir.queries import copy_stages, pull_rereads
from tilec.ir.tiling import invert
from tilec.ir.types import ME, Access, Load, Var, map_expr

from .base import Pass


def _swap_rank(a: Access, r: str) -> Access:
    rank = {r: ME, ME: r}.get(a.rank, a.rank)
    return replace(a, rank=rank, index=tuple(i.rename({r: ME, ME: r}) for i in a.index))


@dataclass(frozen=True)
class FuseComm(Pass):
    mode: str = "pull"
    name = "fuse-comm"

    def apply(self, g: nx.DiGraph) -> nx.DiGraph:
        if self.mode not in ("pull", "push"):
            raise ScheduleError(f"fuse-comm: unknown mode '{self.mode}' (pull or push)")
        return self._pull(g) if self.mode == "pull" else self._push(g)

    def _pull(self, g: nx.DiGraph) -> nx.DiGraph:
        prog = program_of(g)
        fused, why, seen = 0, [], set()
        while True:  # re-scan after each fusion: a fused copy can turn its consumer into a non-copy
            todo = [s for s in copy_stages(g, single=False) if s.name not in seen]
            if not todo:
                break
            cp = todo[0]
            seen.add(cp.name)
            computed = [x.value.access.tensor for x in cp.body
                        if payload_of(g, tid(x.value.access.tensor)).kind != "in"]
            if computed:
                why.append(f"stage '{cp.name}' ({cp.loc}) copies '{computed[0]}', which the program computes; pulling"
                           " it straight from the peers would need flags on it (use fused-push or flags)")
                continue
            if len(cp.body) > 1:
                why.append(f"stage '{cp.name}' ({cp.loc}) copies several tensors (fused-pull fuses one-tensor copies)")
                continue
            cnt = counted_loop(cp.loops)
            if cnt is not None:  # a pull reads the source for every row, the copy only rows under the count
                why.append(f"stage '{cp.name}' ({cp.loc}) copies only the rows under its count {cnt.count}; reading"
                           " its source in its place would read every row")
                continue
            st = cp.body[0]
            buf, src = st.access, st.value.access
            remote_readers = [r for c in stages(g) for r in c.reads()
                              if isinstance(r, Load) and r.access.tensor == buf.tensor and r.access.remote]
            if remote_readers and not payload_of(g, tid(src.tensor)).symmetric:
                why.append(f"'{buf.tensor}' is read on peers, so pulling its source '{src.tensor}' means reading"
                           f" '{src.tensor}' on a peer, and '{src.tensor}' is not symmetric")
                continue
            tb = payload_of(g, tid(buf.tensor))
            writers = [s for s in stages(g) if any(x.access.tensor == buf.tensor for x in s.body)]
            if tb.kind != "buf" or len(writers) != 1 or buf.remote:
                why.append(f"'{buf.tensor}' is not a buffer written only locally by stage '{cp.name}' ({cp.loc})")
                continue
            loops = {v.name: v for v in cp.loops} | {ME: Var(ME, "me", prog.world, 1, cp.loc)}
            invert(buf, loops, set(), prog.world, f"fused-pull of stage '{cp.name}'")
            fixed = [v.derived.evaluate({}) for v in cp.loops if v.derived is not None and not v.derived.vars]
            if fixed:  # `X@0`: no loop variable names the rank a consumer's tile came from
                why.append(f"stage '{cp.name}' ({cp.loc}) copies '{src.tensor}' from a fixed rank ({fixed[0]}): a"
                           " pull reads a copy's source by the loop variables that index its tiles (bsp, flags and"
                           " specialized run it)")
                continue
            if not all(v.name in buf.vars for v in cp.loops):
                via = [v.name for v in cp.loops if v.name not in buf.vars and v.name in peers.inputs(buf.vars, loops)]
                why.append(f"stage '{cp.name}' ({cp.loc}) indexes {buf.tensor} through a peer expression of"
                           f" '{via[0]}' ({buf}): a"
                           " pull reads a copy's source by the loop variables that index its tiles (flags and"
                           " fused-push run it)" if via else
                           f"stage '{cp.name}' ({cp.loc}) writes the same tile from several tasks")
                continue

            def to_pull(e, buf=buf, src=src, cp=cp):
                if isinstance(e, Load) and e.access.tensor == buf.tensor:
                    return Pull(e.access, buf, src, cp.loops, src_dtype(g, src), e.shape, e.loc)
                return e

            for c in stages(g):
                if c.name != cp.name:
                    body = tuple(replace(s, value=map_expr(s.value, to_pull)) for s in c.body)
                    if body != c.body:
                        note = f"pulls {buf.tensor} from {src.tensor}@{src.rank}"
                        set_payload(g, sid(c.name), replace(c, body=body, note=_join(c.note, note)))
            for c, _p, n, loops in pull_rereads(g):  # said where `tilec show` prints the stage (perf/auto.py acts)
                st = payload_of(g, sid(c))
                note = f"re-reads each tile of {_p.source.tensor} {n} times (once per {', '.join(loops)})"
                if note not in st.note:
                    set_payload(g, sid(c), replace(st, note=_join(st.note, note)))
            g.remove_node(sid(cp.name))
            g.remove_node(tid(buf.tensor))
            update_state(g, order=_drop_dangling_barriers([n for n in node_order(g) if n != sid(cp.name)], g))
            fused += 1
        if not fused:
            raise ScheduleError("fused-pull does not apply: " + (_steps_once(why) or "no stage is a pure tile copy"))
        rebuild_edges(g)
        return g

    def _push(self, g: nx.DiGraph) -> nx.DiGraph:
        pushed, why = 0, []
        for cp in copy_stages(g, single=False):
            loops = {v.name for v in cp.loops}
            rv = cp.body[0].value.access.rank
            ok = all(st.value.access.rank == rv and not st.access.remote for st in cp.body) and rv in loops
            if not ok:
                why.append(f"stage '{cp.name}' ({cp.loc}) does not pull from a peer chosen by a rank loop into local"
                           " tiles")
                continue
            cnt = counted_loop(cp.loops)
            if cnt is not None:  # the count is the receiving rank's input: a push runs the stage on the sender
                why.append(f"stage '{cp.name}' ({cp.loc}) counts its rows by {cnt.count}, an input of the receiving"
                           " rank; a push would run it on the sending rank, which holds its own")
                continue
            bad = [st.access.tensor for st in cp.body if not payload_of(g, tid(st.access.tensor)).symmetric]
            if bad:
                why.append(f"'{bad[0]}' is not symmetric, so peers cannot store into it (stage '{cp.name}', {cp.loc})")
                continue
            # a reader with no barrier after the copy relied on the copy being this rank's own earlier task; a push
            # comes from a peer at any time
            racy = _same_phase_readers(g, cp)
            if racy:
                why.append(f"stage '{racy[0].name}' ({racy[0].loc}) reads '{racy[1]}' in the phase of stage"
                           f" '{cp.name}' (no barrier between them), so tiles pushed by peers could arrive after it"
                           " reads them")
                continue
            turned = peers.transpose(cp.loops, rv, program_of(g).world, ME)  # a peer expression: its inverse
            if turned is None:
                why.append(f"stage '{cp.name}' ({cp.loc}) pulls from a peer expression ({cp.body[0].value.access})"
                           " that does not"
                           " invert: a push needs the rank that pulled")
                continue
            body = tuple(replace(st, access=_swap_rank(st.access, rv),
                                 value=replace(st.value, access=_swap_rank(st.value.access, rv))) for st in cp.body)
            dsts = ", ".join(f"{st.access.tensor}@{rv}" for st in cp.body)
            set_payload(g, sid(cp.name), replace(cp, loops=turned, body=body, note=_join(cp.note, f"pushes to {dsts}")))
            pushed += 1
        if not pushed:
            if any(st.access.remote for s in stages(g) for st in s.body):
                return g  # the program already stores into its peers: nothing to transpose
            raise ScheduleError("fused-push does not apply: " + (_steps_once(why) or "no stage is a pure tile copy"))
        rebuild_edges(g)
        return g


def _steps_once(why: list[str]) -> str:
    """The reasons joined, one per ring (frontend/steps.py): the reason of steps 'ring_1', 'ring_2', ... of a ring
    that is the one of 'ring_0' is said once, for its first step."""
    first: dict[str, str] = {}
    again: set[str] = set()
    for w in why:
        key = re.sub(r"'(\w+)_\d+'", r"'\1_*'", w)
        if key in first and key != w:
            again.add(key)
        first.setdefault(key, w)
    return "; ".join(w + (" (and its later steps)" if k in again else "") for k, w in first.items())


def _same_phase_readers(g: nx.DiGraph, cp: Stage) -> tuple[Stage, str] | None:
    """A stage other than `cp` that reads a tensor `cp` writes in the same phase (no barrier between them)."""
    written = {st.access.tensor for st in cp.body}
    phase = next(p for p in phases(g) if any(s.name == cp.name for s in p))
    for s in phase:
        hit = [r.access.tensor for r in s.reads() if isinstance(r, Load) and r.access.tensor in written]
        if s.name != cp.name and hit:
            return s, hit[0]
    return None


def src_dtype(g: nx.DiGraph, a: Access) -> str:
    return payload_of(g, tid(a.tensor)).dtype


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b


def _drop_dangling_barriers(order: list[str], g: nx.DiGraph) -> tuple[str, ...]:
    """Barriers with no stage before them (or doubled) separate nothing once a stage is gone."""
    out: list[str] = []
    for n in order:
        if kind_of(g, n) == "barrier" and (not out or kind_of(g, out[-1]) == "barrier"):
            g.remove_node(n)
            continue
        out.append(n)
    while out and kind_of(g, out[-1]) == "barrier":
        g.remove_node(out.pop())
    return tuple(out)
