"""Rule transport: every stage moves its tiles by `sm` or `dma`, and a dma stage copies tiles whose
sources no stage writes, in a graph ordered by flags (passes/transport.dma_blocker says why not).
"""

from __future__ import annotations

from tilec.ir.graph import DMA, SM

from .context import Ctx


def check(ctx: Ctx) -> None:
    from ..transport import dma_blocker

    for s in ctx.stages:
        if s.transport not in (SM, DMA):
            ctx.err(s.loc, f"stage '{s.name}' has transport {s.transport!r}, neither {SM!r} nor {DMA!r}")
        elif s.transport == DMA:
            why = dma_blocker(ctx.g, s)
            if why:
                ctx.err(s.loc, f"stage '{s.name}' cannot run on the copy engines: {why}")
