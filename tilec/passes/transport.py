"""transport: choose who moves a copy stage's tiles, the SMs (tasks of a persistent kernel) or the copy engines.

A copy stage (every store a plain tile load of the same tile shape, reading only tensors no stage writes, so its
sources are ready once a call's entry barrier passed) may lower to transport=dma: it leaves the kernels (persist
skips it) and the runtime issues its copies as device-to-device copies on side streams, one chunk per flag
counter, setting each chunk's counter right after the chunk's copies (runtime/dma.py; the table is
codegen/dma.py's DMA_COPIES). A chunk sets its counter once per call, so the stage's flags count 1 per call.
Consumers wait per tile exactly as on SM-moved tiles.

A copy engine sets a counter to the call's epoch; it cannot add to it. So a counter must be set by one chunk of
one rank: where a pushing stage's flag counts the tiles that several ranks push into one peer with one counter
(granularity=tensor: one counter per peer for every sender), each sending rank gets counters of its own (`rank`
joins the flag's key) and readers wait for every sender's; a flag that cannot be split so is a ScheduleError.

  Before:  flag Ag.gather [-] (tensor), +2 per call: both ranks' pushes into rank p's one counter
  After:   flag Ag.gather [rank], +1 per call: rank q's pushes into rank p set counter q of rank p

mode: dma (every qualifying copy stage; a ScheduleError when none qualifies), auto (sm everywhere, the graph
unchanged: the pass sits below the cost model, and the choice per shape is tilec.perf.auto's, which compiles the
variant it ranks first with transport=dma or sm), or per stage, `STAGE=MODE,...` (e.g. `gather=dma`: a named
stage that cannot run on the copy engines is a ScheduleError; stages not named stay on the SMs). sm is the default
and runs no pass.

  Before:  stage gather ...: Ag[r*M/W + m, k] = A@r[m, k];  release Ag.gather      (flag +4 per call)
  After:   stage gather ... [transport dma]: Ag[r*M/W + m, k] = A@r[m, k];  release Ag.gather   (+1 per call)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import networkx as nx

from tilec.errors import ScheduleError
from tilec.ir.gather import counted_loop, gathered
from tilec.ir.graph import (
    DMA,
    FLAGS,
    SM,
    Flag,
    Stage,
    flags,
    kind_of,
    payload_of,
    program_of,
    set_payload,
    sid,
    stages,
    sync,
)
from tilec.ir.nodes import ranks_per_node
from tilec.ir.tiling import flag_size, invert
from tilec.ir.types import ME, Load, Var
from tilec.ir.wait_plan import release_signature

from .base import Pass
from .names import TRANSPORTS


def parse_transport(spec: str) -> tuple[str, dict[str, str]]:
    """`sm`, `dma`, `auto` or `STAGE=MODE,...` -> (the mode of stages not named, {stage: mode}); ValueError saying
    what is wrong otherwise."""
    if not isinstance(spec, str):
        raise ValueError(f"transport={spec!r}: a string, one of {', '.join(TRANSPORTS)} or STAGE=MODE,...")
    if "=" not in spec:
        if spec not in TRANSPORTS:
            raise ValueError(f"transport={spec!r}: choose from {', '.join(TRANSPORTS)}, or STAGE=MODE,...")
        return spec, {}
    per: dict[str, str] = {}
    for part in spec.split(","):
        name, _, mode = (x.strip() for x in part.partition("="))
        if not name.isidentifier() or mode not in TRANSPORTS or name in per:
            raise ValueError(f"transport={spec!r}: '{part}' is not STAGE=MODE with MODE one of {', '.join(TRANSPORTS)}"
                             " (each stage once)")
        per[name] = mode
    return SM, per


def wants_dma(spec: str) -> bool:
    default, per = parse_transport(spec)
    return default == DMA or DMA in per.values()


def dma_blocker(g: nx.DiGraph, s: Stage) -> str | None:
    """Why stage `s` cannot run on the copy engines (None: it can). Shared with the verifier's dma rule."""
    if sync(g) != FLAGS:
        return "its consumers are ordered by barriers, not flags (a copy engine releases flags only)"
    rpn, world = ranks_per_node(g), program_of(g).world
    if rpn < world and any(st.access.remote or (isinstance(st.value, Load) and st.value.access.remote)
                           for st in s.body):  # some peer of some rank lies off its node (the nodes rule)
        return (f"its copies reach peers off a rank's node (ranks_per_node={rpn} of {world} ranks), and a copy engine "
                "reaches peers by pointer")
    cnt = counted_loop(s.loops)
    if cnt is not None:  # the copy engines' plan is fixed at compile time; the count is read at run time
        return f"it copies only the rows under the data-dependent count {cnt.count} (a copy engine's plan is fixed)"
    written = {st.access.tensor for x in stages(g) for st in x.body}
    for st in s.body:
        v = st.value
        if not isinstance(v, Load) or st.part is not None:
            return f"it computes {st.access} instead of copying a tile"
        a, b = st.access, v.access
        if gathered(a) or gathered(b):  # rows named by data, not a box (else it reads as a reshape)
            return f"{st.access} = {b} moves rows through an index (a gather or scatter); a copy engine copies boxes"
        if b.tensor in written:
            return f"it reads '{b.tensor}', which a stage writes in the same call (a copy engine cannot wait on it)"
        if a.tile != b.tile or a.shape != b.shape or len(a.index) != len(b.index):
            return f"{st.access} = {b} reshapes the tile (a copy engine copies boxes of the same shape)"
        if a.tensor == b.tensor:
            return f"it copies '{a.tensor}' into itself"
    return None


@dataclass(frozen=True)
class Transport(Pass):
    mode: str = "dma"
    name = "transport"

    def apply(self, g: nx.DiGraph) -> nx.DiGraph:
        try:
            default, per = parse_transport(self.mode)
        except ValueError as e:
            raise ScheduleError(str(e)) from None
        names = [s.name for s in stages(g)]
        unknown = sorted(set(per) - set(names))
        if unknown:
            raise ScheduleError(f"transport={self.mode}: no stage named {', '.join(map(repr, unknown))} here (stages:"
                                f" {', '.join(names)}; a fusing schedule may have folded a copy stage away)")
        if default != DMA and DMA not in per.values():
            return g  # auto: the SMs keep every copy (perf.auto chooses dma explicitly where it pays)
        released = {f.producer for f in flags(g)}
        picked, why = [], []
        for s in stages(g):
            if per.get(s.name, default) != DMA:
                continue
            reason = dma_blocker(g, s)
            if reason is None and s.name not in released:
                reason = "no stage reads what it writes in the same call"
            if reason is None:
                picked.append(s.name)
            elif s.name in per:  # asked for by name: it must go
                raise ScheduleError(f"transport={self.mode}: stage '{s.name}' ({s.loc}) cannot run on the copy engines:"
                                    f" {reason}")
            elif all(isinstance(st.value, Load) for st in s.body):
                why.append(f"stage '{s.name}': {reason}")
        if not picked:
            raise ScheduleError("transport=dma: no copy stage can run on the copy engines"
                                + (f" ({'; '.join(why)})" if why else " (the schedule left no copy stage)"))
        for n in list(g):
            p, kind = payload_of(g, n), kind_of(g, n)
            if kind == "stage" and p.name in picked:
                set_payload(g, n, replace(p, transport=DMA))
            elif kind == "flag" and p.producer in picked:
                # one counter write per chunk (a chunk is one counter), one chunk per counter
                set_payload(g, n, replace(one_sender(g, p), count=1))
        return g


def one_sender(g: nx.DiGraph, f: Flag) -> Flag:
    """Flag `f` of a copy-engine stage with every counter set by one rank's chunk: a push flag whose key leaves
    out the sending rank (`rank`) gets it in its key, so each sender sets counters of its own; a ScheduleError
    where the written index does not name the sender."""
    world = program_of(g).world
    if world == 1 or f.write.rank == ME:  # pulls: the rank that copies owns the counters, one chunk each
        return f
    p = payload_of(g, sid(f.producer))
    members = [(f.write, f.key), *f.also]
    if all(ME in key for _w, key in members):
        return f
    loops = {v.name: v for v in p.loops} | {ME: Var(ME, "me", world, 1, p.loc)}
    split = []
    for write, key in members:
        if ME not in {v for a in write.index for v in a.vars}:
            raise ScheduleError(f"transport=dma: stage '{p.name}' ({p.loc}) pushes {write} from every rank into one"
                                f" counter of flag {f.name}, and its index does not say which rank sent a tile; a copy"
                                " engine sets a counter, it cannot count senders (use transport=sm for this stage)")
        split.append((write, key if ME in key else (*key, ME)))
    dims = invert(split[0][0], loops, set(split[0][1]), world, f"transport=dma for stage '{p.name}'")
    out = replace(f, key=split[0][1], size=flag_size(dims), also=tuple(split[1:]))
    sigs = {release_signature(out.member(w.tensor), p, world) for w, _k in split}
    if len(sigs) > 1:
        raise ScheduleError(f"transport=dma: stage '{p.name}' ({p.loc}) shares flag {f.name} between its stores, and"
                            " with a counter per sending rank they would count different tiles (use transport=sm for"
                            " it)")
    return out
