"""The NVSHMEM printer of the kernel IR (kir.py): the same tree as the Iris printer, with the accesses that may reach
a peer off this rank's node spelled as NVSHMEM operations of tilec/device_nvshmem.py.

On one node (ranks_per_node = world) every peer is reached by pointer and the kernels print as Iris's do (the heap
is torch symmetric memory, the module imports tilec.device_nvshmem as td). With several nodes, `lower` rewrites the
tree before it is simplified, by this op table:

    load of a pointer through a peer offset   -> td.get     (a pointer load on the node, else a get)
    store through a peer offset               -> td.put     (a pointer store on the node, else a put)
    remote_load (rows on several ranks)       -> td.remote_get
    wait / wait_all on a peer's counter       -> td.wait_peer / td.wait_all_peer (a signal word polled by gets)
    release of a peer's counter               -> td.signal  (put-with-signal, NVSHMEM_SIGNAL_ADD)

A pointer is "through a peer offset" when its value reads a name bound to a `peer_offset` (directly or through
names bound from it); the peer is that call's rank argument. Waits and releases on this rank's own counters stay
`td.wait` / `td.release` (acquire loads of the local signal word, the GPU timer, tilec's timeout). Nothing else
changes, so the rewrites and the printer (triton_printer.Printer) are shared.
"""

from __future__ import annotations

from dataclasses import replace

from . import kir as K
from .triton_printer import Printer

__all__ = ["NVSHMEM_SUFFIX", "OP_SPELLING", "NvshmemPrinter", "lower"]

# kir operation -> the NVSHMEM-aware call and the arguments it takes after the operation's own
OP_SPELLING = {
    "load": "td.get",
    "store": "td.put",
    "remote_load": "td.remote_get",
    "wait": "td.wait_peer",
    "wait_all": "td.wait_all_peer",
    "release": "td.signal",
}
RANK = K.Name("rank")
NVSHMEM_SUFFIX = "_nvshmem"  # the kernels that call NVSHMEM: torch's post-compile hook initializes their modules


class NvshmemPrinter(Printer):
    """Prints a kernel lowered by `lower` (every call is then an Iris operation or a td.* name)."""

    def __init__(self, world: int, ranks_per_node: int, wrap_calls: frozenset[str] | None = None):
        super().__init__(wrap_calls)
        self.world, self.ranks_per_node = world, ranks_per_node

    def prepare(self, kern: K.Kernel) -> K.Kernel:
        if self.ranks_per_node >= self.world:
            return kern
        return lower(kern, self.world, self.ranks_per_node)


def printer_for(options: dict, world: int) -> Printer:
    """The printer of a module's backend (codegen options "backend", "ranks_per_node")."""
    if options.get("backend", "iris") == "nvshmem":
        return NvshmemPrinter(world, options.get("ranks_per_node") or world)
    return Printer()


def backend_fields(options: dict, world: int) -> dict:
    """The module model's fields that name the backend (none for Iris: its modules keep their text)."""
    if options.get("backend", "iris") != "nvshmem":
        return {}
    return {"device_module": "tilec.device_nvshmem", "backend": "nvshmem",
            "ranks_per_node": options.get("ranks_per_node") or world}


def lower(kern: K.Kernel, world: int, ranks_per_node: int) -> K.Kernel:
    """Every access of kern that may reach a peer off the node as an NVSHMEM operation (the module's op table). An
    entry that then calls NVSHMEM is renamed `<name>_nvshmem`: torch initializes NVSHMEM's device state in the modules
    of kernels so named (its post-compile hook; some releases look for "nvshmem" in the kernel's name), and only those
    are launched with NVSHMEM's device library (a kernel that calls none has no device state to initialize: NVSHMEM's
    module init fails with 'named symbol not found')."""
    def fn(f: K.Fn) -> K.Fn:
        return replace(f, body=_lower_body(f.body, _peer_names(f.body), world, ranks_per_node))

    entry, tasks = fn(kern.entry), tuple(fn(t) for t in kern.tasks)
    if not any(_calls_nvshmem(f.body) for f in (entry, *tasks)):
        return K.Kernel(entry, tasks)  # no NVSHMEM call: a module without NVSHMEM's device state cannot be initialized
    return K.Kernel(replace(entry, name=f"{entry.name}{NVSHMEM_SUFFIX}"), tasks)


def _calls_nvshmem(body: tuple[K.Stmt, ...]) -> bool:
    """Whether body calls an NVSHMEM operation of the op table (after lower)."""
    spelled, found = frozenset(OP_SPELLING.values()), []

    def look(e: K.Expr) -> K.Expr:
        if isinstance(e, K.Call) and e.fn in spelled:
            found.append(e.fn)
        return e

    K.map_exprs(body, look)
    return bool(found)


def _peer_names(body: tuple[K.Stmt, ...]) -> dict[str, K.Expr]:
    """name -> the peer its value is an address or offset into (bound from a peer_offset, or from such a name)."""
    peers: dict[str, K.Expr] = {}
    changed = True
    while changed:
        changed = False
        for s in K.walk(body):
            if not isinstance(s, K.Assign | K.AugAssign):
                continue
            target = s.target.id if isinstance(s.target, K.Name) else None
            if target is None or target in peers:
                continue
            peer = _peer_of(s.value, peers)
            if peer is not None:
                peers[target] = peer
                changed = True
    return peers


def _peer_of(e: K.Expr, peers: dict[str, K.Expr]) -> K.Expr | None:
    for c in K.calls_in(e):
        if c.fn == "peer_offset":
            return c.args[2]
    for n in K.names_in(e):
        if n in peers:
            return peers[n]
    return None


def _split(args: tuple[K.Expr, ...]) -> tuple[list[K.Expr], list[K.Expr]]:
    return [a for a in args if not isinstance(a, K.Kw)], [a for a in args if isinstance(a, K.Kw)]


def _lower_body(body: tuple[K.Stmt, ...], peers: dict[str, K.Expr], world: int, rpn: int) -> tuple[K.Stmt, ...]:
    tail = (K.Const(world), K.Const(rpn))

    def one(e: K.Expr) -> K.Expr:
        if not isinstance(e, K.Call) or not isinstance(e.fn, str) or e.fn not in OP_SPELLING:
            return e
        pos, kws = _split(e.args)
        if e.fn in ("load", "store"):
            peer = _peer_of(pos[0], peers)
            if peer is None:
                return e
            common = (peer, RANK, K.Name("heap_bases"), K.Name("ERR"), *tail, K.Name("INTERPRET"))
            if e.fn == "load":
                return K.Call(OP_SPELLING["load"], (pos[0], *common, *kws))
            return K.Call(OP_SPELLING["store"], (pos[0], pos[1], *common, *kws))
        if e.fn == "remote_load":  # (ptrs, rank, owner, heap_bases, mask=, other=)
            return K.Call(OP_SPELLING["remote_load"], (*pos[:4], K.Name("ERR"), *tail, K.Name("INTERPRET"), *kws))
        owner = pos[{"wait": 3, "wait_all": 5, "release": 2}[e.fn]]
        if owner == RANK:  # this rank's own signal word: the Iris spelling (acquire loads, the GPU timer)
            return e
        if e.fn == "release":  # (flag, rank, owner, heap_bases, SCOPE)
            return K.Call(OP_SPELLING["release"], (*pos, K.Name("INTERPRET"), *tail))
        return K.Call(OP_SPELLING[e.fn], (*pos, *tail))  # waits end with (SCOPE, INTERPRET)

    return K.map_exprs(body, one)
