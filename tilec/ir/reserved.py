"""The names a generated kernel module gives its own values: the task number `t`, the rank, the heap, the launch
constants, the modules it imports. A program's dims, tiles, tensors and loop variables may not take them (sema says
so, located): the emitted code would read the kernel's value where the program meant its own (a loop variable `t`
of a two-loop stage was decoded from itself, and its rows went wrong)."""

from __future__ import annotations

import keyword
import re

# the kernels' parameters and locals that are not temporaries (codegen/text.Names keeps temporaries off the
# program's own names) and the module's globals
KERNEL_NAMES = frozenset({
    "t", "task", "pid", "rank", "epoch", "ERR", "heap_bases", "timeout_ns", "EPOCH_AT", "NPROG", "INTERPRET",
    "GRAPH", "PDL", "CLAIM", "claim", "TIMELINE", "g_size", "g_first", "g_rows", "tl", "triton", "td", "iris", "at",
    "copied", "t_all", "tile", "WORLD", "SCHEDULE", "KERNELS", "TENSORS", "FLAGS", "DMA_COPIES", "NUM_STAGES",
    "NUM_WARPS", "EXIT_BARRIER",
})
# Python's keywords, and the builtins the emitted code calls
RESERVED = KERNEL_NAMES | frozenset(keyword.kwlist) | frozenset({"range", "min", "max", "int", "float"})


DERIVED = re.compile(r"_(peer|piece)\d+")  # the variables a stage's peers and index pieces become (ir/peers.py)


def reserved_problem(name: str, what: str) -> str | None:
    """The error for a program naming a `what` (dim, tile, tensor, loop variable) `name`, or None."""
    if DERIVED.fullmatch(name):
        return f"{what} '{name}' is a name tilec gives a stage's peers and index pieces (_peerN, _pieceN); rename it"
    if name not in RESERVED:
        return None
    why = "a Python keyword" if keyword.iskeyword(name) else "a name the generated kernels use for their own values"
    return f"{what} '{name}' is {why}; rename it (reserved: {', '.join(sorted(RESERVED - set(keyword.kwlist)))})"
