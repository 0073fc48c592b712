"""The one evaluator of index and size expressions: a .tile AST expression as an affine form.

`affine(e, env, unknowns)` = (terms, const) with e == sum(terms[v] * v) + const over the names in `unknowns`,
every other name taking its value from `env`. Numbers stay exact: int and Fraction (a division is rational), or
torch.SymInt sizes (torch.compile's dynamic shapes; a division of symbolic sizes is a floor division, exact for the
programs sema accepted). Sema reads indexes (unknowns: the loop variables) and dims through it; `tilec.op` reads
declared shapes (one unknown: the dim an input's size gives).

It lives in the frontend, the lowest layer that knows the AST; what is not affine raises NotAffine with the
location and the reason, which sema reports and `tilec.op` takes as "cannot solve for this dim from here".
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from fractions import Fraction
from typing import Any

from tilec.errors import Loc
from tilec.frontend import ast

Num = Any  # int | Fraction | torch.SymInt (the frontend does not import torch)


class NotAffine(Exception):
    def __init__(self, loc: Loc, msg: str):
        super().__init__(msg)
        self.loc, self.msg = loc, msg


def concrete(x) -> bool:
    """Whether x is a known number (not a symbolic size)."""
    return isinstance(x, int | Fraction)


def norm(x):
    """A whole Fraction as an int; anything else as it is."""
    return int(x) if isinstance(x, Fraction) and x.denominator == 1 else x


def is_zero(x) -> bool:
    return concrete(x) and x == 0


def _mul(a, b):
    return norm(Fraction(a) * Fraction(b)) if concrete(a) and concrete(b) else norm(a) * norm(b)


def _div(a, b, loc: Loc):
    if concrete(a) and concrete(b):
        return norm(Fraction(a) / Fraction(b))
    a, b = norm(a), norm(b)
    if isinstance(a, Fraction) or isinstance(b, Fraction):
        raise NotAffine(loc, "a fraction of a symbolic size")
    return a // b


def _add(a: dict, b: dict, sign: int) -> dict:
    out = dict(a)
    for v, k in b.items():
        out[v] = norm(out[v] + _mul(k, sign)) if v in out else _mul(k, sign)
    return {v: k for v, k in out.items() if not is_zero(k)}


def affine(e: ast.Expr, env: Mapping[str, Num], unknowns: Container[str] = (),
           piece=None) -> tuple[dict[str, Num], Num]:
    """(terms, const) of e: coefficients of the unknowns, the rest folded into the constant (see the module).
    piece(op, terms, const, by, loc) -> (terms, const), where given, is the value of a `%` or `//` of unknowns by a
    constant (an index piece, ir/peers.py: sema names it as one more unknown)."""
    if isinstance(e, ast.Int):
        return {}, e.value
    if isinstance(e, ast.Name):
        if e.id in env:
            return {}, env[e.id]
        if e.id in unknowns:
            return {e.id: 1}, 0
        raise NotAffine(e.loc, f"unknown name '{e.id}'")
    if isinstance(e, ast.Neg):
        t, c = affine(e.operand, env, unknowns, piece)
        return {v: _mul(k, -1) for v, k in t.items()}, _mul(c, -1)
    if isinstance(e, ast.BinOp) and e.op in ("+", "-", "*", "/", "%", "//"):
        lt, lc = affine(e.lhs, env, unknowns, piece)
        rt, rc = affine(e.rhs, env, unknowns, piece)
        if e.op in "+-":
            s = 1 if e.op == "+" else -1
            return _add(lt, rt, s), norm(lc + _mul(rc, s))
        if e.op == "*":
            if lt and rt:
                raise NotAffine(e.loc, "index is not affine: product of two loop variables")
            terms = {v: _mul(k, rc) for v, k in lt.items()} | {v: _mul(k, lc) for v, k in rt.items()}
            return {v: k for v, k in terms.items() if not is_zero(k)}, _mul(lc, rc)
        if rt:
            raise NotAffine(e.loc, f"index is not affine: '{e.op}' by a loop variable")
        if is_zero(rc):
            raise NotAffine(e.loc, "division by zero")
        if e.op == "/":
            return {v: _div(k, rc, e.loc) for v, k in lt.items()}, _div(lc, rc, e.loc)
        if lt and piece is not None:
            return piece(e.op, lt, lc, rc, e.loc)
        if lt:
            raise NotAffine(e.loc, f"index is not affine: '{e.op}' of a loop variable")
        if not (concrete(lc) and concrete(rc)):
            raise NotAffine(e.loc, f"'{e.op}' of a symbolic size")
        if e.op == "//":
            return {}, norm(Fraction(lc) // Fraction(rc))
        return {}, norm(Fraction(lc) % Fraction(rc))
    if isinstance(e, ast.Ref):  # `X[idx[m], k]`: a gather, which the tile graph cannot express
        raise NotAffine(e.loc, f"'{e.tensor}[...]' reads a tensor: data-dependent indices are not supported yet (hint:"
                               " an index is affine in loop variables and dims; a value read from an i32 tensor can"
                               " be a count, such as attend's `n`, or take part in tile math)")
    raise NotAffine(getattr(e, "loc", None), "only integer arithmetic on dims and loop variables may appear here")
