"""The typing and shape rules of tile math inside one tile: broadcasting, `@`, reductions along a dim (`sum(x, dim=d)`,
`max`, `min`), transposes and permutations (`x.T`), casts (`f32(x)`, `i32(x)`) and `lse_merge`'s `dim`.

Every rule is a function of shapes returning the result's shape or a message saying why the operands do not fit
(sema puts the location in front). A tile's dims are its *logical* dims (ir.types.logical_shape): a dim a load
indexes by one element is not a dim, so `X[b, m, k]` with `b` a single element is a 2-d tile. docs/tile_operations.md
is the user's reference of these rules.
"""

from __future__ import annotations

Shape = tuple[int, ...]

CASTS = ("f16", "bf16", "f32", "i32")
REDUCTIONS = {"sum": "sum_dim", "max": "max_dim", "min": "min_dim"}  # `sum(x, dim=d)` and friends -> Op name
PERMUTE = "permute"  # Op name of a transpose / permutation (Op.attr: the permutation)
OPS = (*REDUCTIONS.values(), PERMUTE)  # the Op names of this module


def _shp(s: Shape) -> str:
    return "[" + ", ".join(map(str, s)) + "]"


def broadcast(a: Shape, b: Shape) -> Shape | None:
    """numpy's rule: align the shapes at their last dim, pad the shorter with leading 1s; each pair of dims must be
    equal or one of them 1. None: they do not fit. () is a scalar and goes with anything."""
    if not a or not b:
        return a or b
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for x, y in zip(a, b, strict=True):
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return tuple(out)


def matmul(a: Shape, b: Shape) -> Shape | str:
    """`a @ b`: [M, K] @ [K, N] -> [M, N]; leading dims of size 1 (a [1, 1, M, K] tile of a 4-d tensor) are
    dropped first. (The tiles' own shapes, not their logical ones: `A[m, j] @ B[j, n]` with `j` one element is a
    [BM, 1] @ [1, BN] product.)"""
    sa, sb = _matrix(a), _matrix(b)
    if sa is None or sb is None:
        return f"'@' needs 2-d tiles, got {_shp(a)} @ {_shp(b)} (leading dims of size 1 are dropped)"
    if sa[1] != sb[0]:
        return f"shape mismatch in '@': {_shp(a)} @ {_shp(b)} (inner dims {sa[1]} and {sb[0]} differ)"
    return (sa[0], sb[1])


def _matrix(s: Shape) -> Shape | None:
    s = tuple(s)
    while len(s) > 2 and s[0] == 1:
        s = s[1:]
    return s if len(s) == 2 else None


def matrix_shape(s: Shape) -> Shape:
    """The [rows, cols] an operand of `@` is taken as (matmul accepted it)."""
    m = _matrix(s)
    assert m is not None, s
    return m


def check_dim(fn: str, shape: Shape, dim: int) -> int | str:
    """dim of a tile of this logical shape (negative counts from the end), or the message why it is none."""
    n = len(shape)
    if not -n <= dim < n:
        has = f"a {n}-d tile {_shp(shape)}" if n else "a single element"
        return f"{fn}(..., dim={dim}): {has} has no dim {dim}" + (f" (dims are 0..{n - 1})" if n else "")
    return dim % n


def reduce(fn: str, shape: Shape, dim: int) -> Shape | str:
    """`sum/max/min(x, dim=d)`: the tile without dim d."""
    d = check_dim(fn, shape, dim)
    if isinstance(d, str):
        return d
    return shape[:d] + shape[d + 1:]


def transpose(shape: Shape) -> Shape | str:
    if len(shape) != 2:
        return f"'.T' transposes a 2-d tile, got a {len(shape)}-d tile {_shp(shape)}"
    return (shape[1], shape[0])


def to_front(n: int, dim: int) -> tuple[int, ...]:
    """The permutation of n dims that moves `dim` first, the others in order."""
    return (dim, *(i for i in range(n) if i != dim))


def permuted(shape: Shape, perm: tuple[int, ...]) -> Shape:
    return tuple(shape[i] for i in perm)


def reduce_dtype(fn: str, dtype: str) -> str:
    """Integer tiles reduce to integers; other tiles accumulate and compare in f32."""
    return "i32" if dtype == "i32" else "f32"


def reference(op: str, attr: tuple[int, ...], x):
    """The torch value of a reduction or permutation of tile x (its logical shape; the reference interpreter)."""
    if op == PERMUTE:
        return x.permute(*attr)
    d, keep = attr
    if op == "sum_dim":
        return x.sum(d, keepdim=bool(keep))
    return x.amax(d, keepdim=bool(keep)) if op == "max_dim" else x.amin(d, keepdim=bool(keep))

