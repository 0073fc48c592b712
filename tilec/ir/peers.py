"""Peer expressions and index pieces: integer functions of the executing rank and of loop variables.

A `Piece` is `(sum(coef * var) + const) % by` or `(sum(coef * var) + const) // by` for a constant `by`. A peer,
`X@(rank + s + 1)[...]`, is a `%` piece by the world size: the rank it names wraps round the ring. An index such as
`((rank + 1) % W) * M + m` uses a piece as one term of its affine start offset.

Sema gives each distinct piece of a stage a derived variable (`Var.derived`, kind "peer" for a peer, "piece"
otherwise): a variable of one trip whose value every task computes from the others. Everything that enumerates a
stage's variables (ir/regions.grid, the reference interpreter, codegen's task decode) computes it with `values` /
`evaluate`; everything that reads variables by name (flags, waits, the emitted code) reads it like a loop
variable. A peer's variable is a rank variable: its flags and waits name the one peer it holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Piece:
    """`(sum(k * v) + const) <op> by` with op "%" or "//"; terms sorted by variable name, no zero coefficient.
    A `%` piece keeps its coefficients and constant reduced modulo `by`, so two spellings of one peer are equal
    (`rank + W - 1` and `rank - 1`)."""

    terms: tuple[tuple[str, int], ...]
    const: int
    op: str  # "%" | "//"
    by: int

    @staticmethod
    def make(terms: dict[str, int], const: int, op: str, by: int) -> Piece:
        if op == "%":
            terms = {v: k % by for v, k in terms.items()}
            const %= by
        return Piece(tuple(sorted((v, int(k)) for v, k in terms.items() if k)), int(const), op, int(by))

    @property
    def vars(self) -> tuple[str, ...]:
        return tuple(v for v, _ in self.terms)

    def evaluate(self, env) -> int:
        """The piece's value where the variables take the values of `env` (ints, or numpy arrays)."""
        x = self.const
        for v, k in self.terms:
            x = x + k * env[v]
        return x % self.by if self.op == "%" else x // self.by

    def values(self, env: dict[str, np.ndarray]) -> np.ndarray:
        """Vectorised evaluate over a grid of variable values (ir/regions.grid)."""
        n = combinations(env)
        return np.asarray(self.evaluate(env), dtype=np.int64) + np.zeros(n, dtype=np.int64)

    def span(self, ranges: dict[str, tuple[int, int]]) -> tuple[int, int]:
        """The smallest and largest value of the affine part where each variable v takes values in ranges[v]."""
        lo = hi = self.const
        for v, k in self.terms:
            a, b = ranges[v]
            lo, hi = lo + min(k * a, k * b), hi + max(k * a, k * b)
        return lo, hi

    def reach(self, ranges: dict[str, tuple[int, int]]) -> tuple[int, int]:
        """The smallest and largest value the piece itself may take."""
        lo, hi = self.span(ranges)
        if self.op == "//":
            return lo // self.by, hi // self.by
        if lo >= 0 and hi < self.by:
            return lo, hi
        return 0, self.by - 1

    def ranks(self, values: dict[str, range]) -> set[int]:
        """The ranks (values) a peer can name, the variables taking every combination of `values`."""
        names = list(self.vars)
        grids = np.meshgrid(*[np.asarray(values[v], dtype=np.int64) for v in names], indexing="ij") if names else []
        env = {v: g.ravel() for v, g in zip(names, grids, strict=True)}
        return {int(x) for x in np.unique(self.values(env))}

    def inverts(self, var: str) -> bool:
        """Whether, the other variables fixed, the piece takes a different value for every value of `var` in
        [0, by) (a `%` piece whose coefficient of var is prime to `by`): `rank + s` steps round every rank."""
        k = dict(self.terms).get(var, 0)
        return self.op == "%" and k != 0 and math.gcd(k, self.by) == 1

    def nonneg(self, ranges: dict[str, tuple[int, int]]) -> int:
        """A multiple of `by` that makes the affine part non-negative for every value in `ranges` (the emitted
        code adds it, so its `%` and `//` agree with Python's floor semantics on every backend)."""
        lo, _ = self.span(ranges)
        return 0 if lo >= 0 else -(lo // self.by) * self.by

    def __str__(self) -> str:
        parts = [(v if k == 1 else f"{k}*{v}") for v, k in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return f"({' + '.join(parts)}) {self.op} {self.by}"


def same_peer(a: Piece, b: Piece) -> bool:
    """Whether two peers name the same rank in every task (their normal forms are equal)."""
    return a == b


def flatten(terms: dict[str, int], const: int, pieces: dict[str, Piece], by: int) -> tuple[dict[str, int], int]:
    """terms + const with every `% by` piece among them replaced by its own affine part: (x % W + y) % W is
    (x + y) % W. Other pieces stay as variables."""
    out: dict[str, int] = {}
    for v, k in terms.items():
        p = pieces.get(v)
        if p is not None and p.op == "%" and p.by % by == 0:
            for u, j in p.terms:
                out[u] = out.get(u, 0) + k * j
            const += k * p.const
        else:
            out[v] = out.get(v, 0) + k
    return {v: k for v, k in out.items() if k}, const


def combinations(env: dict) -> int:
    """How many combinations of variable values a grid (ir/regions.grid, then derive) holds: 1 for no variables."""
    return next((len(x) for x in env.values() if isinstance(x, np.ndarray)), 1)


def derive(env: dict, dom: dict) -> dict:
    """env with the value of every derived variable of `dom` (Var.derived) whose inputs env holds, in the order
    dom lists them (a piece only uses variables defined before it)."""
    n = combinations(env)
    for name, v in dom.items():
        p = getattr(v, "derived", None)
        if p is not None and name not in env and all(x in env for x in p.vars):
            # a fixed rank (`X@0`, no inputs) takes its one value in every combination
            env[name] = p.values(env) if p.vars else np.full(n, p.evaluate({}), dtype=np.int64)
    return env


def inputs(names, dom: dict) -> set[str]:
    """`names` with every derived variable replaced by the variables it is computed from (transitively)."""
    out: set[str] = set()
    todo = list(names)
    while todo:
        n = todo.pop()
        p = getattr(dom.get(n), "derived", None)
        if p is None:
            out.add(n)
        else:
            todo += list(p.vars)
    return out


def known_from(known, dom: dict) -> set[str]:
    """The variables whose value `known` fixes: each derived variable known, with every input of it known but one
    that it steps through every value of (Piece.inverts; a peer `rank + s` and `rank` give `s`), makes that one
    known too, and a known derived variable's inputs known when all of them are determined that way. A flag's
    counter, its holder and key known, then says which producer tasks bump it (replace-barriers' count)."""
    out = set(known)
    grew = True
    while grew:
        grew = False
        for name, v in dom.items():
            p = getattr(v, "derived", None)
            if p is None:
                continue
            if name not in out and all(x in out for x in p.vars):
                out.add(name)
                grew = True
            elif name in out:
                left = [x for x in p.vars if x not in out]
                u = left[0] if len(left) == 1 else None
                x = dom.get(u)  # `rank`, a rank loop or a unit-step loop: values 0..extent-1, one each for the piece
                if x is not None and x.derived is None and x.step == 1 and x.extent <= p.by and p.inverts(u):
                    out.add(left[0])
                    grew = True
    return out


def tasks_per_value(names, dom: dict, limit: int = 1 << 20) -> int | None:
    """How many tasks (combinations of dom's plain variables) give `names` each combination of values they take,
    counted by enumerating the variables they are computed from; None where that number differs between
    combinations or the enumeration would exceed `limit`. known_from's algebra cannot count a peer that is not one
    `%` piece stepping through its input (the pair partner `rank + 1 - 2 * (rank % 2)` names each rank once, but
    `rank` is not solvable from it): this counts it exactly."""
    rel = inputs(names, dom)
    plain = [v for v in dom.values() if v.derived is None]
    vs = [v for v in plain if v.name in rel]
    n = math.prod(v.trips for v in vs)
    if n > limit:
        return None
    mesh = np.meshgrid(*[np.arange(v.trips, dtype=np.int64) * v.step for v in vs], indexing="ij")
    env = derive({v.name: m.ravel() for v, m in zip(vs, mesh, strict=True)}, dom)
    keys = np.stack([np.broadcast_to(np.asarray(env[x], dtype=np.int64), (max(n, 1),)) for x in sorted(names)])
    _, counts = np.unique(keys, axis=1, return_counts=True)
    if counts.min() != counts.max():
        return None
    return int(counts[0]) * math.prod(v.trips for v in plain if v.name not in rel)


def transpose(loops: tuple, rv: str, world: int, me: str = "rank") -> tuple | None:
    """The loops of a copy stage whose task on rank `me` pulls from the rank its peer variable `rv` names, for the
    same copies run by that peer, pushing (fuse-comm push renames `me` and `rv` in the accesses): every piece has
    `me` and `rv` swapped, and rv's own piece is inverted, rank = a^-1 (rv - rest) mod W, so the new `rv` is the
    rank that pulled. None where that inverse does not exist (rank's coefficient shares a factor with W, or the
    rest depends on another piece)."""
    from dataclasses import replace

    by = {v.name: v for v in loops}
    swap = {me: rv, rv: me}

    def swapped(v):
        q = v.derived
        terms: dict[str, int] = {}
        for u, k in q.terms:
            terms[swap.get(u, u)] = terms.get(swap.get(u, u), 0) + k
        return replace(v, derived=Piece.make(terms, q.const, q.op, q.by))

    p = getattr(by.get(rv), "derived", None)
    if p is None:  # a plain rank loop: the pieces of the index still swap (`Ag[((r + 1) % W) * M/W + m]`)
        return tuple(v if v.derived is None else swapped(v) for v in loops)
    a = dict(p.terms).get(me, 0)
    rest = {u: k for u, k in p.terms if u != me}
    if math.gcd(a, world) != 1 or any(getattr(by.get(u), "derived", None) is not None for u in rest):
        return None
    inv = pow(a, -1, world)
    inverted = Piece.make({me: inv, **{u: -inv * k for u, k in rest.items()}}, -inv * p.const, "%", world)
    plain = [v for v in loops if v.derived is None]
    others = [swapped(v) for v in loops if v.derived is not None and v.name != rv]
    return (*plain, replace(by[rv], derived=inverted), *others)
