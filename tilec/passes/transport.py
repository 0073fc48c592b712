"""transport: choose who moves a copy stage's tiles, the SMs (tasks of a persistent kernel) or the copy engines.

A copy stage (every store a plain tile load of the same tile shape, reading only tensors no stage writes, so its
sources are ready once a call's entry barrier passed) may lower to transport=dma: it leaves the kernels (persist
skips it) and the runtime issues its copies as device-to-device copies on side streams, one chunk per flag
counter, setting each chunk's counter right after the chunk's copies (runtime/dma.py; the table is
codegen/dma.py's DMA_COPIES). A chunk sets its counter once per call, so the stage's flags count 1 per call.
Consumers wait per tile exactly as on SM-moved tiles.

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
from tilec.ir.graph import DMA, FLAGS, SM, Stage, flags, stages, sync
from tilec.ir.types import Load

from .base import Pass

TRANSPORTS = ("sm", "dma", "auto")


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
    written = {st.access.tensor for x in stages(g) for st in x.body}
    for st in s.body:
        v = st.value
        if not isinstance(v, Load) or st.part is not None:
            return f"it computes {st.access} instead of copying a tile"
        a, b = st.access, v.access
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
                raise ScheduleError(f"transport={self.mode}: stage '{s.name}' cannot run on the copy engines:"
                                    f" {reason}")
            elif all(isinstance(st.value, Load) for st in s.body):
                why.append(f"stage '{s.name}': {reason}")
        if not picked:
            raise ScheduleError("transport=dma: no copy stage can run on the copy engines"
                                + (f" ({'; '.join(why)})" if why else " (the schedule left no copy stage)"))
        for _n, d in g.nodes(data=True):
            p = d["payload"]
            if d["kind"] == "stage" and p.name in picked:
                d["payload"] = replace(p, transport=DMA)
            elif d["kind"] == "flag" and p.producer in picked:
                d["payload"] = replace(p, count=1)  # one counter write per chunk (a chunk is one counter)
        return g
