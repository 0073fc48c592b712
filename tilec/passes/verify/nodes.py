"""Rule nodes: peers off a rank's node are never reached by pointer.

With `ranks_per_node` smaller than the world (backend nvshmem), a rank reaches the peers of its own node by pointer
and the others only by NVSHMEM puts, gets and signal words, which the NVSHMEM printer emits for every access through a
peer offset (codegen/nvshmem_printer.py). What cannot become a put or a get is a copy on the copy engines (a `dma`
stage copies between peers' memory by pointer), so this rule rejects a `dma` stage whose copies cross nodes, naming
a pair of ranks on different nodes. `check_placement` checks the options themselves (tilec.compile calls it before
the program is read): ranks_per_node divides the world, and only backend nvshmem has more than one node.
"""

from __future__ import annotations

from dataclasses import replace

from tilec.errors import ArgumentError
from tilec.ir.graph import DMA
from tilec.ir.nodes import off_node_peers, ranks_per_node

from .context import Ctx


def check_placement(opts, world: int, transport: str = "sm"):
    """opts (settings.Options) with ranks_per_node resolved against the world (0: the world); ArgumentError naming
    the option otherwise."""
    rpn = opts.ranks_per_node or world
    if world % rpn:
        raise ArgumentError(f"ranks_per_node={rpn}: must divide the world ({world} ranks), so every node holds as "
                            "many ranks")
    if rpn < world and opts.backend != "nvshmem":
        raise ArgumentError(f"ranks_per_node={rpn}: backend {opts.backend!r} reaches every peer by pointer, on one "
                            "node; use backend 'nvshmem' (--backend nvshmem) for ranks on several nodes")
    if opts.backend == "nvshmem" and opts.wait_sleep_ns:
        raise ArgumentError(f"wait_sleep_ns={opts.wait_sleep_ns}: backend 'nvshmem' polls without sleeping; "
                            "leave it 0")
    return replace(opts, ranks_per_node=0 if rpn == world else rpn)


def check(ctx: Ctx) -> None:
    rpn = ranks_per_node(ctx.g)
    if rpn >= ctx.world:
        return
    for s in ctx.stages:
        if s.transport != DMA:
            continue
        reads = [("reads", r.access) for r in s.reads() if hasattr(r, "access")]
        for verb, a in reads + [("writes", x.access) for x in s.body]:
            if a.remote:  # a rank loop's peer: every rank, so some off this rank's node
                peer = off_node_peers(0, ctx.world, rpn)[0]
                ctx.err(a.loc, f"stage '{s.name}' cannot run on the copy engines across nodes: rank 0 {verb} "
                        f"{a.tensor} of rank {peer}, off its node (ranks_per_node={rpn}), and copy engines reach "
                        "peers by pointer; use transport=sm")
                break
