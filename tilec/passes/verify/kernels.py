"""Rule kernels: every stage runs in exactly one kernel (a dma stage in none, the copy engines run it),
kernels run the stages in program order, a kernel waits at a global barrier exactly where the program has one
before its first stage and never runs a stage past one, and program groups belong to persistent kernels.
"""

from __future__ import annotations

from tilec.ir.graph import DMA

from .context import Ctx


def check(ctx: Ctx) -> None:
    ks = ctx.kernels
    if ks is None:
        return
    names = [s.name for s in ctx.stages if s.transport != DMA]
    ran = [s for k in ks for s in k.stages]
    for k in ks:
        if not k.stages:
            ctx.err(None, f"kernel {k.name} runs no stage")
    for s in ctx.stages:
        n = ran.count(s.name)
        if n != (s.transport != DMA):
            want = "none (the copy engines run it)" if s.transport == DMA else "one"
            ctx.err(s.loc, f"stage '{s.name}' runs in {n} kernels, not {want}")
    if ran != names and sorted(ran) == sorted(names):
        first = next(a for a, b in zip(ran, names, strict=True) if a != b)
        ctx.err(ctx.stages[ctx.pos[first]].loc, f"kernels run the stages in the order {', '.join(ran)}, not in"
                                                f" program order ({', '.join(names)})")
    for k in ks:
        if not k.stages or any(s not in ctx.pos for s in k.stages):
            continue
        loc = ctx.stages[ctx.pos[k.stages[0]]].loc
        first = k.stages[0]
        if k.barrier_before != ctx.barrier_before[first]:
            has = "has" if ctx.barrier_before[first] else "has no"
            ctx.err(loc, f"kernel {k.name} {'waits' if k.barrier_before else 'does not wait'} at a global barrier"
                         f" before it, but the program {has} barrier before stage '{first}'")
        for s in k.stages[1:]:
            if ctx.barrier_before[s]:
                ctx.err(loc, f"kernel {k.name} runs stage '{s}' past a global barrier: a kernel cannot wait at one")
        if k.groups and (len(k.groups) != len(k.stages) or not k.persistent):
            ctx.err(loc, f"kernel {k.name} gives {len(k.groups)} program groups to {len(k.stages)} stages"
                         f"{'' if k.persistent else ' and is not persistent'}")
