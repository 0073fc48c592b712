"""Sema's half of peer expressions and index pieces (the algebra is tilec/ir/peers.py).

A stage's `X@(rank + s + 1)[...]` and `((rank + 1) % W) * M + m` are checked here: a peer is affine in `rank` and
rank loop variables (taken modulo W); a `%` or `//` in an index divides by a constant and uses only variables of one
element per task (rank, rank loops, unit-step loops), as a tile loop must stay the tile's start, coefficient 1.
Each distinct piece becomes one derived variable of the stage (`Var.derived`), named `_peerN` or `_pieceN`.
"""

from __future__ import annotations

from fractions import Fraction

from tilec.errors import Loc
from tilec.frontend import ast
from tilec.frontend.affine import NotAffine, affine
from tilec.ir.peers import Piece, flatten
from tilec.ir.types import ME, Var


class StagePieces:
    def __init__(self, world: int, consts: dict[str, int]):
        self.world, self.consts = world, consts
        self.vars: dict[str, Var] = {}  # derived variables by name, in the order they were made
        self._named: dict[Piece, str] = {}

    def derived(self) -> tuple[Var, ...]:
        return tuple(self.vars.values())

    def range_of(self, v: str, vars_: dict[str, Var]) -> tuple[int, int]:
        """The smallest and largest value variable v takes (a derived one: what its piece can reach)."""
        x = vars_[v]
        if x.derived is None:
            return 0, max(x.extent - 1, 0)
        p: Piece = x.derived
        return p.reach({u: self.range_of(u, vars_) for u in p.vars})

    def _of_ranks(self, v: str, vars_: dict[str, Var]) -> bool:
        """Whether v is an index piece of `rank` and rank loops only (`rank % 2` in `X@(rank + 1 - 2 * (rank % 2))`)."""
        p = vars_[v].derived
        return p is not None and all(_scalar(vars_[u]) or self._of_ranks(u, vars_) for u in p.vars)

    def callback(self, vars_: dict[str, Var]):
        """affine()'s `piece` hook for an index of this stage."""
        def piece(op: str, terms: dict, const, by, loc: Loc) -> str:
            return self._piece(op, terms, const, by, loc, vars_)
        return piece

    def _piece(self, op: str, terms: dict, const, by, loc: Loc, vars_: dict[str, Var]) -> tuple[dict, int]:
        if not (isinstance(by, int | Fraction) and Fraction(by).denominator == 1 and by > 0):
            raise NotAffine(loc, f"'{op}' by {by}: an index piece divides by a positive integer constant")
        by = int(by)
        if any(Fraction(k).denominator != 1 for k in terms.values()) or Fraction(const).denominator != 1:
            raise NotAffine(loc, f"'{op}' of a fraction: the expression before '{op}' must be an integer")
        terms, const = {v: int(k) for v, k in terms.items()}, int(const)
        if op == "%" and all((k * vars_[v].step) % by == 0 for v, k in terms.items()):
            return {}, const % by  # every value of the terms is a multiple of `by`: the remainder is the constant's
        if op == "//" and all(k % by == 0 for k in terms.values()):
            return {v: k // by for v, k in terms.items()}, const // by  # an exact division: affine after all
        if op == "%":  # reduced modulo `by` first: at a world of 2, `(rank - 2) % W` is `rank`
            terms, const = {v: k % by for v, k in terms.items() if k % by}, const % by
        lo, hi = Piece.make(terms, const, "//", 1).span({v: self.range_of(v, vars_) for v in terms})
        if 0 <= lo and hi < by and all(vars_[v].kind != "tile" or vars_[v].step == 1 for v in terms):
            return (terms, const) if op == "%" else ({}, 0)  # never wraps: `(rank + 0) % W` is `rank`
        tiles = [v for v in terms if vars_[v].kind == "tile" and vars_[v].step > 1]
        if tiles:
            v = tiles[0]
            raise NotAffine(loc, f"'{op} {by}' of tile loop '{v}' (step {vars_[v].step}) is not tile-aligned: a tile"
                                 f" would split; keep '{v}' outside the '{op}' with coefficient 1, or use a piece of"
                                 " rank, rank loops and unit-step loops")
        terms, const = flatten(terms, const, {n: x.derived for n, x in self.vars.items()}, by) if op == "%" else \
            (terms, const)
        kind = "peer" if op == "%" and by == self.world and all(vars_[v].is_rank for v in terms) else "piece"
        return {self._name(Piece.make(terms, const, op, by), kind, loc, vars_): 1}, 0

    def _name(self, p: Piece, kind: str, loc: Loc, vars_: dict[str, Var]) -> str:
        if p not in self._named:
            name = f"_{kind}{sum(1 for x in self.vars.values() if x.kind == kind)}"
            self._named[p] = name
            self.vars[name] = Var(name, kind, 1, 1, loc, derived=p)
        name = self._named[p]
        vars_[name] = self.vars[name]
        return name

    def peer(self, e: ast.Expr, vars_: dict[str, Var]) -> str:
        """The rank variable `X@(e)` names: `rank` or a rank loop variable itself, else a derived peer."""
        where = f"peer '{_text(e)}'"
        try:
            terms, c = affine(e, self.consts, vars_, self.callback(vars_))
        except NotAffine as x:
            raise NotAffine(x.loc, f"{where} is not affine in `rank` and rank loop variables ({x.msg})") from None
        if any(Fraction(k).denominator != 1 for k in terms.values()) or Fraction(c).denominator != 1:
            raise NotAffine(e.loc, f"{where} is not an integer for every task")
        for v in terms:
            if not (_scalar(vars_[v]) or self._of_ranks(v, vars_)):
                raise NotAffine(e.loc, f"{where} uses '{v}', which is not `rank`, a rank loop variable or a unit-step"
                                       " loop (a peer is affine in those, modulo the world size)")
        terms, c = flatten({v: int(k) for v, k in terms.items()}, int(c),
                           {n: x.derived for n, x in self.vars.items()}, self.world)
        p = Piece.make(terms, c, "%", self.world)
        if self.world == 1:  # every peer is this rank
            return ME
        if p.const == 0 and len(p.terms) == 1 and p.terms[0][1] == 1 and vars_[p.terms[0][0]].derived is None:
            return p.terms[0][0]
        return self._name(p, "peer", e.loc, vars_)


def _scalar(v: Var) -> bool:
    """A variable of one value per task a peer may use: `rank`, a rank loop, a unit-step loop (`s in W - 1 by 1`)."""
    return v.is_rank or (v.kind == "tile" and v.step == 1)


_PREC = {"+": 1, "-": 1, "*": 2, "/": 2, "%": 2, "//": 2}


def _text(e: ast.Expr, prec: int = 0) -> str:
    """The expression as written, parenthesized where precedence needs it (the AST has no parentheses:
    `(rank + 1) % 0` must not read `rank + 1 % 0`)."""
    if isinstance(e, ast.Int | ast.Float):
        return str(e.value)
    if isinstance(e, ast.Name):
        return e.id
    if isinstance(e, ast.Neg):
        return f"-{_text(e.operand, 3)}"
    if isinstance(e, ast.BinOp):
        p = _PREC.get(e.op, 2)
        # the right operand binds tighter: `a - (b - c)`, `a * (b // c)` keep their parentheses
        s = f"{_text(e.lhs, p)} {e.op} {_text(e.rhs, p + 1)}"
        return f"({s})" if p < prec else s
    return "..."

