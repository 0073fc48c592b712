"""Size limits of .tile programs, checked before anything is allocated or recursed over.

Each is far beyond what a real program on today's GPUs uses (an H200 holds 141 GB: 2**36 f16 elements) and far
below what breaks the compiler (Python's recursion limit, NumPy's array limits, Triton's largest block).
"""

import math

MAX_WORLD = 1024  # ranks
MAX_LITERAL = 2**40  # an integer literal
MAX_SIZE = 2**40  # a dim, a tensor dimension, a tensor's elements
# elements of one tile: Triton materializes at most 2**20 in one block (TRITON_MAX_TENSOR_NUMEL), but a tile that
# codegen streams (the keys of an attend, in blocks of attend_block) may be larger: 1M-key decode splits use 2**21
MAX_TILE = 2**24
MAX_TASKS = 2**24  # tasks of one stage, trips of one reduction
MAX_LOOPS = 32  # loops of one stage, `:` slices included (NumPy arrays have at most 64 dims)
MAX_SOURCE = 2**16  # characters of one program (real ones have a few thousand; lark parses ~20K a second)
MAX_DEPTH = 64  # nesting of operators, calls and sums in one expression (Python and Triton recurse over it)

# ---- limits of the target: a program past them compiles here but fails when Triton builds its kernel --------------

TRITON_MAX_NUMEL = 2**20  # elements of one block (triton.language.TRITON_MAX_TENSOR_NUMEL), on every backend
# shared memory one program may use (the opt-in maximum per block), per target as `tilec check --target` names it
SHARED_PER_PROGRAM = {"cuda:80": 166912, "cuda:86": 101376, "cuda:89": 101376, "cuda:90": 232448,
                      "cuda:100": 232448, "hip:gfx90a": 65536, "hip:gfx942": 65536}
MAX_SHARED = max(SHARED_PER_PROGRAM.values())  # no target has more: a program past it fails on every one


def _walk_tiles(e, streamed: bool = False):
    """(expression, whether codegen may stream it block by block) for every tile an expression materializes."""
    from tilec.ir.types import Dot, Op, Sum, TupleCall

    yield e, streamed
    if isinstance(e, TupleCall):
        for i, a in enumerate(e.args):  # attend's keys and values (args 1, 2) stream in blocks of attend_block
            yield from _walk_tiles(a, e.fn == "attend" and i in (1, 2))
    elif isinstance(e, Op):
        for a in e.args:
            yield from _walk_tiles(a)
    elif isinstance(e, Dot):
        yield from _walk_tiles(e.lhs)
        yield from _walk_tiles(e.rhs)
    elif isinstance(e, Sum):
        yield from _walk_tiles(e.body)


def _what(e) -> str:
    from tilec.ir.types import Load

    return f"the tile {e.access}" if isinstance(e, Load) else "a tile of the expression"


def pipelined_shared_bytes(e, num_stages: int) -> int:
    """At least how many bytes of shared memory a reduction's dot of tiles loaded from memory takes: Triton's
    pipeliner keeps num_stages - 1 copies of both operand tiles in flight (a lower bound: layouts and epilogues
    take more), so a program past a target's limit surely fails to build there."""
    from tilec.ir.dtypes import ESIZE
    from tilec.ir.types import Dot, Load, Sum

    if not isinstance(e, Sum) or not isinstance(e.body, Dot):
        return 0
    ops = (e.body.lhs, e.body.rhs)
    if not all(isinstance(x, Load) and e.var.name in x.access.vars for x in ops):
        return 0
    return max(0, num_stages - 1) * sum(math.prod(x.access.shape) * ESIZE[x.dtype] for x in ops)


def tile_problems(items, num_stages: int | None = None, target: str | None = None) -> list:
    """Diagnostics for the tiles of stages (`items`, sema's StageIRs) that no kernel can hold: more elements than
    Triton's block limit, or (with num_stages) more pipelined shared memory than the target (default: any known
    target) gives one program. Each names the tile, its size and the limit, at the tile's source location."""
    from tilec.errors import Diagnostic

    limit = SHARED_PER_PROGRAM.get(target, MAX_SHARED) if target else MAX_SHARED
    out = []
    for it in items:
        for st in getattr(it, "body", ()):
            tiles = [(st.access, False)] + list(_walk_tiles(st.value))
            big = max((e for e, streamed in tiles if not streamed), key=lambda e: math.prod(e.shape))
            n = math.prod(big.shape)
            if n > TRITON_MAX_NUMEL:  # one per statement: its largest tile
                what = f"the tile {big}" if hasattr(big, "index") else _what(big)
                out.append(Diagnostic(big.loc, f"{what} has {' x '.join(map(str, big.shape))} = {n} elements, more"
                                               f" than Triton's limit of 2**20 = {TRITON_MAX_NUMEL} per block; use"
                                               " smaller tiles", "limits"))
                continue
            for e, _ in tiles if num_stages is not None else ():
                b = pipelined_shared_bytes(e, num_stages)
                if b > limit:
                    where = f"target {target}" if target else "any known target"
                    out.append(Diagnostic(e.loc, f"the reduction over '{e.var.name}' pipelines {num_stages - 1}"
                                                 f" copies of its dot's tiles ({e.body.lhs.access} and"
                                                 f" {e.body.rhs.access}): at least {b} bytes of shared memory, more"
                                                 f" than {where} gives one program ({limit}); use smaller tiles or"
                                                 " fewer num_stages", "limits"))
                    break
    return out
