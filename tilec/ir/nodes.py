"""Which ranks share a node: ranks [n * ranks_per_node, (n + 1) * ranks_per_node) are node n. Ranks of one node reach
each other's symmetric memory by pointer; a peer off the node only through NVSHMEM puts, gets and signals. The
verifier (passes/verify/nodes.py), the NVSHMEM printer and the device functions (tilec/device_nvshmem.py) share
this one rule; the graph carries the compile option as `g.graph["ranks_per_node"]` (absent: one node).
"""

from __future__ import annotations

import networkx as nx

from .graph import program_of


def ranks_per_node(g: nx.DiGraph) -> int:
    """The graph's ranks per node (the world where the option was not given)."""
    world = program_of(g).world
    return g.graph.get("ranks_per_node") or world


def node_of(rank: int, per_node: int) -> int:
    return rank // per_node


def off_node(rank: int, peer: int, per_node: int) -> bool:
    return node_of(rank, per_node) != node_of(peer, per_node)


def off_node_peers(rank: int, world: int, per_node: int) -> list[int]:
    """The ranks `rank` reaches only by NVSHMEM (none on one node)."""
    return [p for p in range(world) if off_node(rank, p, per_node)]
