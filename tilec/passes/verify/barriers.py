"""Rule barriers: the graph's sync mode is barriers or flags, and no global barrier is left once flags
replace them.
"""

from __future__ import annotations

from tilec.ir.graph import BARRIERS, FLAGS, sync

from .context import Ctx


def check(ctx: Ctx) -> None:
    if sync(ctx.g) not in (BARRIERS, FLAGS):
        ctx.err(None, f"the graph's sync is {sync(ctx.g)!r}, neither {BARRIERS!r} nor {FLAGS!r}")
    for _, d in ctx.g.nodes(data=True):
        if ctx.flagged and d["kind"] == "barrier":
            ctx.err(d["payload"].loc, "a global barrier is left after replace-barriers")
