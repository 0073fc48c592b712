"""Rule deadlock: a stage waits only on earlier stages: in a kernel launched before it (both persistent
when they run side by side) or earlier in the same persistent kernel; the waits have no cycle.
"""

from __future__ import annotations

import networkx as nx

from .context import Ctx, stage_waits


def check(ctx: Ctx) -> None:
    wg = nx.DiGraph()
    ks = ctx.kernels
    for c in ctx.stages:
        for w in stage_waits(ctx.g, c.name):
            f = ctx.flags.get(w.flag)
            if f is None or f.producer not in ctx.pos:
                continue
            p = f.producer
            wg.add_edge(c.name, p)
            if p == c.name:
                ctx.err(w.loc, f"stage '{c.name}' waits on its own flag {w.flag}: a program that may not be running")
                continue
            if ctx.pos[p] > ctx.pos[c.name]:
                ctx.err(w.loc, f"stage '{c.name}' waits on stage '{p}', which comes later: a program that may not be"
                               " running")
            if ks is None or p not in ctx.kernel_of or c.name not in ctx.kernel_of:
                continue
            kp, kc = ctx.kernel_of[p], ctx.kernel_of[c.name]
            if kp > kc:
                ctx.err(w.loc, f"stage '{c.name}' (kernel {ks[kc].name}) waits on stage '{p}' of kernel {ks[kp].name},"
                               " which is launched after it")
            elif kp == kc and not ks[kp].persistent:
                ctx.err(w.loc, f"kernel {ks[kp].name} waits on its own programs but is not persistent")
            elif kp < kc and ks[kp].concurrent and not (ks[kp].persistent and ks[kc].persistent):
                lazy = ks[kp] if not ks[kp].persistent else ks[kc]
                ctx.err(w.loc, f"stage '{c.name}' waits on stage '{p}' of a kernel running beside it, but kernel"
                               f" {lazy.name} is not persistent: its programs may hold every SM while the"
                               " producer's programs cannot start")
    try:
        cyc = nx.find_cycle(wg)
        ctx.err(ctx.stages[ctx.pos[cyc[0][0]]].loc, "wait cycle: " + " -> ".join(u for u, _ in cyc))
    except nx.NetworkXNoCycle:
        pass
