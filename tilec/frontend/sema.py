"""Semantic checks: bind dims, resolve names, type tiles, prove indexes affine and accesses in bounds.

Every problem is collected (with its location) and reported together as one CompileError. The result is a
`BoundProgram`: the AST with every number resolved, ready for the `lower` pass.
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from fractions import Fraction

from tilec.errors import ArgumentError, CompileError, Diagnostic, Loc
from tilec.frontend import ast, rows
from tilec.frontend.affine import NotAffine, affine
from tilec.frontend.limits import MAX_LOOPS, MAX_SIZE, MAX_TASKS, MAX_TILE, MAX_WORLD, tile_problems
from tilec.frontend.pieces import StagePieces
from tilec.frontend.steps import forwards, ring_steps
from tilec.ir import tile_ops
from tilec.ir.builtins import TILE_FNS
from tilec.ir.peers import inputs as peer_inputs
from tilec.ir.reserved import reserved_problem
from tilec.ir.types import (
    ME,
    Access,
    Affine,
    Const,
    Dot,
    Idx,
    Load,
    Op,
    Store,
    Sum,
    Tensor,
    TExpr,
    TupleCall,
    Var,
    loads,
    logical_shape,
    squeeze,
    trips,
)

UNARY_FNS = {"exp", "log", "sqrt", "relu", "silu", "sigmoid", "tanh", "abs"}
BINARY_FNS = {"max", "min"}
CASTS = set(tile_ops.CASTS)
TUPLE_FNS = {name: f.results for name, f in TILE_FNS.items()}  # tile-library functions with several results


@dataclass(frozen=True)
class StageIR:
    name: str
    loops: tuple[Var, ...]
    body: tuple[Store, ...]
    loc: Loc = field(compare=False, repr=False)


@dataclass(frozen=True)
class BarrierIR:
    loc: Loc = field(compare=False, repr=False)


@dataclass(frozen=True)
class BoundProgram:
    name: str
    world: int
    world_name: str
    dims: tuple[tuple[str, int], ...]
    tiles: tuple[tuple[str, int], ...]
    tensors: tuple[Tensor, ...]
    items: tuple[StageIR | BarrierIR, ...]
    file: str
    source: str = field(compare=False, repr=False)

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)


class _Err(Exception):
    def __init__(self, loc: Loc, msg: str):
        self.loc, self.msg = loc, msg


def _affine(e: ast.Expr, consts: dict[str, int], vars_: dict[str, Var]) -> tuple[dict, Fraction | int]:
    """An index expression as (coefficients of the loop variables, constant), exact (frontend.affine)."""
    try:
        return affine(e, consts, vars_)
    except NotAffine as x:
        raise _Err(x.loc, x.msg) from None


def _ends_here(source: str, loc: Loc) -> bool:
    """Whether nothing but blanks and comments follows `loc` in the source (a file cut short ends there)."""
    lines = source.split("\n")
    line, col = (loc.end_line, loc.end_col) if loc.end_line else (loc.line, loc.col + 1)
    if not 0 < line <= len(lines):
        return False
    rest = "\n".join([lines[line - 1][col - 1:], *lines[line:]])
    return re.fullmatch(r"(?:\s|#[^\n]*)*", rest) is not None


def _in_words(d: Diagnostic, tensors: Mapping[str, Tensor], source: str) -> Diagnostic:
    """An unknown name that is a tensor (used without an index), or where the program ends, says so: a file cut
    short after `... = Ag` is not about an undeclared `Ag`."""
    m = re.fullmatch(r"unknown name '(\w+)'", d.message)
    if not m:
        return d
    name, at_end = m[1], _ends_here(source, d.loc)
    if name in tensors:
        msg = f"'{name}' is a tensor: read its tiles as `{name}[...]`"
        if at_end:
            msg = f"the program ends in the middle of an expression (is the file cut short?): {msg}"
    elif at_end:
        msg = f"{d.message}, where the program ends (is the file cut short?)"
    else:
        return d
    return Diagnostic(d.loc, msg)


def _const(e: ast.Expr, consts: dict[str, int], what: str) -> int:
    terms, c = _affine(e, consts, {})
    if c.denominator != 1:
        raise _Err(e.loc, f"{what} is not an integer ({c.numerator}/{c.denominator})")
    return int(c)


class _Checker:
    def __init__(self, prog: ast.Program, world: int, dims: dict[str, int]):
        self.prog, self.world = prog, world
        self.errors: list[Diagnostic] = []
        self.consts: dict[str, int] = {prog.world: world}
        self.overrides = dict(dims)
        self.tensors: dict[str, Tensor] = {}
        self.dims: list[tuple[str, int]] = []
        self.tiles: list[tuple[str, int]] = []
        self.placeholders: set[str] = set()  # dims and tiles whose value was bad: checked with 1 in its place
        self.value_errors = 0  # how many errors the dims' and tiles' values gave
        self.tainted: set[str] = set()  # tensors and loop variables sized by such dims
        self.pieces = StagePieces(world, self.consts)  # each stage's (stage() starts its own)
        # the stages a ring's steps became (frontend/steps.py), each with its stage and step loop: they may read
        # their tensor
        self.steps: dict[str, tuple[str, str]] = {}
        self._raced_steps: set = set()  # (stage, location) of a step's race already reported

    def err(self, loc: Loc, msg: str) -> None:
        self.errors.append(Diagnostic(loc, msg))

    # -- declarations ---------------------------------------------------------------------------
    def declare(self) -> None:
        p = self.prog
        seen: dict[str, Loc] = {p.world: p.loc}
        for d in (*p.dims, *p.tiles):
            if d.name in seen:
                self.err(d.loc, f"'{d.name}' is already defined")
            elif problem := reserved_problem(d.name, "dim" if d in p.dims else "tile size"):
                self.err(d.loc, problem)
            seen[d.name] = d.loc
        for d in p.dims:
            v = self.overrides.pop(d.name, d.default)
            if v is None:
                self.err(d.loc, f"dim '{d.name}' has no value: give one in the program or with -D {d.name}=N")
                v = 1
                self.placeholders.add(d.name)
            elif v < 1:
                self.err(d.loc, f"dim '{d.name}' must be >= 1, got {v}")
                v = 1  # keeps later checks from dividing by a zero
                self.placeholders.add(d.name)
            elif v > MAX_SIZE:
                self.err(d.loc, f"dim '{d.name}' = {v} is too large (tilec's limit is 2**40 = {MAX_SIZE})")
                v = 1
                self.placeholders.add(d.name)
            self.consts[d.name] = v
            self.dims.append((d.name, v))
        for t in p.tiles:
            v = self.overrides.pop(t.name, t.value)
            if v < 1 or v & (v - 1):
                self.err(t.loc, f"tile size '{t.name}' = {v} must be a power of two (Triton block shapes are)")
                self.placeholders.add(t.name)
                if not 1 <= v <= MAX_TILE:
                    v = 1
            elif v > MAX_TILE:
                self.err(t.loc, f"tile size '{t.name}' = {v} is too large (tilec's limit is 2**24 = {MAX_TILE}"
                                " elements per tile)")
                v = 1
                self.placeholders.add(t.name)
            self.consts[t.name] = v
            self.tiles.append((t.name, v))
        for name in self.overrides:
            self.err(p.loc, f"-D {name}: the program has no dim or tile size named '{name}'")
        self.value_errors = len(self.errors)
        for t in p.tensors:
            if t.name in seen or t.name in self.tensors:
                self.err(t.loc, f"'{t.name}' is already defined")
            elif problem := reserved_problem(t.name, "tensor"):
                self.err(t.loc, problem)
            shape = []
            for s in t.shape:
                try:
                    n = _const(s, self.consts, "tensor size")
                    if n < 1:
                        self.err(s.loc, f"size of '{t.name}' must be >= 1, got {n}")
                    elif n > MAX_SIZE:
                        self.err(s.loc, f"size of '{t.name}' = {n} is too large (tilec's limit is 2**40 ="
                                        f" {MAX_SIZE})" + self._values_hint(s))
                        n = 1
                    shape.append(max(n, 1))
                except _Err as e:
                    self.err(e.loc, f"{e.msg} in the shape of '{t.name}'" + self._values_hint(s))
                    shape.append(1)
            numel = math.prod(shape)
            if numel > MAX_SIZE:
                self.err(t.loc, f"'{t.name}' has {numel} elements: too many (tilec's limit is 2**40 = {MAX_SIZE})")
                shape = [1] * len(shape)
            self.tensors[t.name] = Tensor(t.name, t.kind, t.dtype, tuple(shape), t.symmetric, t.loc)
            if any(self._placeheld(s) for s in t.shape):
                self.tainted.add(t.name)

    def drop_cascades(self, source: str) -> None:
        """Leave out the errors (after the values' own) of expressions that use a dim or tile whose value was bad:
        they were checked with 1 in its place (`-D M=-4` is one error, not also `M/W` not an integer)."""
        if not self.placeholders:
            return
        bad = self.placeholders | self.tainted
        lines = source.split("\n")

        def text(loc: Loc) -> str:
            end_line = max(loc.end_line, loc.line)
            span = lines[loc.line - 1:end_line]
            if not span:
                return ""
            if loc.end_col and end_line == loc.line:
                return span[0][loc.col - 1:loc.end_col - 1]
            return "\n".join(span)[loc.col - 1:]

        names = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(bad))) + r")\b")
        self.errors = self.errors[:self.value_errors] + [
            d for d in self.errors[self.value_errors:]
            if not names.search(text(d.loc)) and not any(f"'{n}'" in d.message for n in bad)]

    def _placeheld(self, e: ast.Expr) -> bool:
        return any(n.id in self.placeholders for n in _names(e))

    def _values_hint(self, e: ast.Expr) -> str:
        names = sorted({n.id for n in _names(e) if n.id in self.consts})
        return f" ({', '.join(f'{n}={self.consts[n]}' for n in names)})" if names else ""

    # -- stages ---------------------------------------------------------------------------------
    def stage(self, s: ast.Stage) -> StageIR | None:
        self.pieces = StagePieces(self.world, self.consts)  # peers and `%` / `//` pieces: derived variables
        vars_: dict[str, Var] = {ME: Var(ME, "me", self.world, 1, s.loc)}
        loops = []
        for lp in s.loops:
            if lp.var in vars_ or lp.var in self.consts or lp.var in self.tensors:
                self.err(lp.loc, f"loop variable '{lp.var}' shadows another name")
                continue
            if problem := reserved_problem(lp.var, "loop variable"):
                self.err(lp.loc, problem)
                continue
            try:
                if lp.kind == "rank":
                    v = Var(lp.var, "rank", self.world, 1, lp.loc)
                else:
                    v = self._tile_var(lp.var, lp.extent, lp.step, lp.loc)
                    if lp.count is not None:  # `upto cnt[e]`: rows past the count are not valid
                        v = rows.counted(self, v, lp.count, vars_)
            except NotAffine as e:
                self.err(e.loc, e.msg)
                v = Var(lp.var, lp.kind, 1, 1, lp.loc)
            except _Err as e:
                self.err(e.loc, e.msg)
                v = Var(lp.var, lp.kind, 1, 1, lp.loc)  # placeholder keeps later uses from cascading
            vars_[lp.var] = v
            if lp.kind != "rank" and (self._placeheld(lp.extent) or self._placeheld(lp.step)):
                self.tainted.add(lp.var)
            loops.append(v)
        tasks = trips(loops)
        if tasks > MAX_TASKS:
            self.err(s.loc, f"stage '{s.name}' has {tasks} tasks: too many (tilec's limit is 2**24 = {MAX_TASKS}"
                            " per stage; use larger tiles)")
            return StageIR(s.name, (), (), s.loc)
        body = []
        self.implicit: list[Var] = []  # `:` slices become one-trip tile loops over the whole dimension
        self.slices = 0  # `:` slices named so far in this stage (a copy's load gives its own up: _share_slices)
        errors = len(self.errors)
        for a in s.body:
            try:
                body += self.assign(a, vars_, tuple(loops), s.name)
            except _Err as e:
                self.err(e.loc, e.msg)
        if not body and len(self.errors) == errors:  # passes take a stage's first store as what it does
            self.err(s.loc, f"stage '{s.name}' stores nothing: every target of its statements is `_`")
        if len(loops) + len(self.implicit) > MAX_LOOPS:
            self.err(s.loc, f"stage '{s.name}' has {len(loops)} loops and {len(self.implicit)} `:` slices: too many"
                            f" (tilec's limit is {MAX_LOOPS} together)")
        return StageIR(s.name, tuple(loops) + tuple(self.implicit) + self.pieces.derived(), tuple(body), s.loc)

    def _tile_var(self, name: str, extent: ast.Expr, step: ast.Expr, loc: Loc) -> Var:
        try:
            n = _const(extent, self.consts, "loop extent")
        except _Err as e:
            raise _Err(e.loc, e.msg + self._values_hint(extent)) from None
        b = _const(step, self.consts, "tile size")
        if n < 1:
            raise _Err(extent.loc, f"loop extent of '{name}' must be >= 1, got {n}" + self._values_hint(extent))
        tile_name = isinstance(step, ast.Name) and step.id in dict(self.tiles)  # already reported at its definition
        if (b < 1 or b & (b - 1)) and not tile_name:
            raise _Err(step.loc, f"tile size of '{name}' = {b} must be a power of two")
        if n > MAX_SIZE:
            raise _Err(extent.loc, f"loop extent of '{name}' = {n} is too large (tilec's limit is 2**40 = {MAX_SIZE})"
                                   + self._values_hint(extent))
        if b > MAX_TILE and not tile_name:
            raise _Err(step.loc, f"tile size of '{name}' = {b} is too large (tilec's limit is 2**24 = {MAX_TILE})")
        v = Var(name, "tile", n, max(b, 1), loc)
        if v.trips > MAX_TASKS:
            raise _Err(loc, f"loop '{name}' makes {v.trips} trips: too many (tilec's limit is 2**24 = {MAX_TASKS};"
                            " use a larger tile)")
        return v

    def assign(self, a: ast.Assign, vars_: dict[str, Var], loops: tuple[Var, ...], stage: str) -> list[Store]:
        value = self.expr(a.value, vars_, top=True)
        outs = value.outs if isinstance(value, TupleCall) else ((value.dtype, squeeze(value.shape)),)
        if len(a.targets) != len(outs):
            what = f"'{value.fn}' returns {len(outs)} results" if isinstance(value, TupleCall) else "one value"
            raise _Err(a.loc, f"{what} but the assignment has {len(a.targets)} target(s)")
        stores = []
        for part, (ref, (dtype, shape)) in enumerate(zip(a.targets, outs, strict=True)):
            if ref is None:
                continue
            target = self.access(ref, vars_, write=True)
            t = self.tensors[target.tensor]
            if t.kind == "in":
                raise _Err(ref.loc, f"'{t.name}' is an input ('in') and cannot be written")
            if t.dtype == "i32" and dtype != "i32":
                raise _Err(a.loc, f"cannot store a {dtype} tile into '{t.name}' of dtype i32")
            tshape = squeeze(target.shape)
            fits = _broadcast(value.shape if len(outs) == 1 else shape, target.shape) == target.shape
            if squeeze(shape) != tshape and not fits:
                raise _Err(a.loc, f"shape mismatch: storing a {_shp(shape)} tile into a {_shp(tshape)} tile of"
                                  f" '{t.name}'")
            self._check_injective(target, loops, stage, ref.loc)
            if isinstance(value, Load) and type(value.access) is Access and type(target) is Access:
                value = self._share_slices(target, value)
            stores.append(Store(target, value, a.loc, part if isinstance(value, TupleCall) else None))
        return stores

    def new_slice(self, n: int, loc: Loc) -> Var:
        """The loop of a `:` over a dim of n elements: one trip, its own name in the stage (`_a0`, `_a1`, ...)."""
        v = Var(f"_a{self.slices}", "tile", n, 1 << (n - 1).bit_length(), loc)
        self.slices += 1
        self.implicit.append(v)
        return v

    def _share_slices(self, target: Access, value: Load) -> Load:
        """A tile copy `Y[m, :] = X[m, :]`: every `:` is a loop of its own (`_a1`, `_a0`), so nothing said the two
        slices are one range, and passes that read the copy's source in its place (local-in-place, fused-pull) or
        copy it by box (dma) dropped the sliced dim's offset. The load's `:` takes the store's where they span dims
        of one length, tiled dim for tiled dim (a copy's tiles correspond in order), and its own loop goes."""
        a = value.access
        mine = {v.name: v for v in self.implicit}
        src, dst = [t for t in a.tile if t], [t for t in target.tile if t]  # the tiled dims, in order
        if len(src) != len(dst):
            return value
        ren = {x: y for x, y in zip(src, dst, strict=True)
               if x != y and x in mine and y in mine and mine[x].extent == mine[y].extent}
        if not ren:
            return value
        index = tuple(Affine(tuple((ren.get(v, v), c) for v, c in ix.terms), ix.const) for ix in a.index)
        tile = tuple(ren.get(t, t) if t else t for t in a.tile)
        self.implicit = [v for v in self.implicit if v.name not in ren]
        return replace(value, access=replace(a, index=index, tile=tile))

    def _check_injective(self, target: Access, loops: tuple[Var, ...], stage: str, loc: Loc) -> None:
        used = peer_inputs(target.vars, self.pieces.vars)
        for v in loops:
            if v.name not in used and v.trips > 1:  # a one-trip loop (or `:`) makes no second task
                raise _Err(loc, f"write conflict in stage '{stage}': tasks that differ only in '{v.name}' write"
                                f" the same tile of '{target.tensor}'")
        by_name = {v.name: v for v in loops}
        for dim, (aff, tv) in enumerate(zip(target.index, target.tile, strict=True)):
            span = by_name[tv].extent if tv in by_name else 1
            for v, k in aff.terms:
                if v in by_name and by_name[v].is_rank and abs(k) < span:
                    raise _Err(loc, f"write conflict in stage '{stage}': tiles of different '{v}' overlap in dim {dim}"
                                    f" of '{target.tensor}' (stride {k} < extent {span})")

    def access(self, r: ast.Ref, vars_: dict[str, Var], write: bool = False) -> Access:
        t = self.tensors.get(r.tensor)
        if t is None:
            raise _Err(r.loc, f"unknown tensor '{r.tensor}'")
        rank = ME
        if r.rank is not None and not isinstance(r.rank, str):  # `X@(rank + 1)`: a peer expression
            if not t.symmetric:
                raise _Err(r.loc, f"'{t.name}' is not symmetric: only symmetric tensors can be accessed on a peer")
            try:
                rank = self.pieces.peer(r.rank, vars_)
            except NotAffine as x:
                raise _Err(x.loc, x.msg) from None
        elif r.rank is not None:
            rv = vars_.get(r.rank)
            if rv is None or not rv.is_rank:
                raise _Err(r.loc, f"'{r.rank}' in '{r.tensor}@{r.rank}' must be a rank loop variable or 'rank'")
            if not t.symmetric:
                raise _Err(r.loc, f"'{t.name}' is not symmetric: only symmetric tensors can be accessed on a peer")
            rank = r.rank
        if len(r.index) != len(t.shape):
            raise _Err(r.loc, f"'{t.name}' has {len(t.shape)} dims but is indexed with {len(r.index)}")
        index, tiles, shape, gathered = [], [], [], []
        for d, e in enumerate(r.index):
            if isinstance(e, ast.Ref):  # a row index read from an i32 tensor (frontend/rows.py)
                try:
                    aff, tv, ext, row = rows.row_dim(self, e, t, d, vars_, write, r.rank)
                except NotAffine as x:
                    raise _Err(x.loc, x.msg) from None
                index.append(aff)
                tiles.append(tv)
                shape.append(ext)
                gathered.append(row)
                continue
            if isinstance(e, ast.Full):
                n = t.shape[d]
                v = self.new_slice(n, e.loc)
                vars_[v.name] = v
                index.append(Affine(((v.name, 1),), 0))
                tiles.append(v.name)
                shape.append(v.step)
                continue
            try:
                terms, c = affine(e, self.consts, vars_, self.pieces.callback(vars_))
            except NotAffine as x:
                raise _Err(x.loc, x.msg) from None
            bad = [v for v, k in terms.items() if k.denominator != 1] + ([""] if c.denominator != 1 else [])
            if bad:
                raise _Err(e.loc, "index is not an integer for every tile" + self._values_hint(e))
            # a tile loop of step 1 is one element: it indexes like a scalar (e.g. `j*BS + p`, `g*G + q`)
            tile_vars = [v for v in terms if vars_[v].kind == "tile" and vars_[v].step > 1]
            if len(tile_vars) > 1:
                raise _Err(e.loc, f"index combines tile loops {' and '.join(tile_vars)} in one dimension")
            if tile_vars and terms[tile_vars[0]] != 1:
                raise _Err(e.loc, f"tile loop '{tile_vars[0]}' must appear with coefficient 1 (strided tiles are not"
                                  " supported)")
            aff = Affine(tuple(sorted((v, int(k)) for v, k in terms.items() if k)), int(c))
            tv = tile_vars[0] if tile_vars else None
            ext = vars_[tv].step if tv else 1
            lo, hi = aff.const, aff.const
            for v, k in aff.terms:
                bot, top = self.pieces.range_of(v, vars_)
                lo, hi = lo + min(k * bot, k * top), hi + max(k * bot, k * top)
            if lo < 0 or hi >= t.shape[d]:
                raise _Err(e.loc, f"index out of bounds: dim {d} of '{t.name}' reaches [{lo}, {hi}] but its size is"
                                  f" {t.shape[d]}")
            index.append(aff)
            tiles.append(tv)
            shape.append(ext)
        _check_tile(shape, r.loc)
        return rows.gathered(Access(t.name, rank, tuple(index), tuple(tiles), tuple(shape), r.loc), gathered)

    def expr(self, e: ast.Expr, vars_: dict[str, Var], top: bool = False) -> TExpr:
        x = self._expr(e, vars_, top)
        if not isinstance(x, TupleCall):
            _check_tile(x.shape, e.loc)
        return x

    def _expr(self, e: ast.Expr, vars_: dict[str, Var], top: bool = False) -> TExpr:
        if isinstance(e, ast.Call) and e.fn in TUPLE_FNS:
            if not top:
                raise _Err(e.loc, f"'{e.fn}' returns several results: use it as `X[...], Y[...] = {e.fn}(...)`")
            return self.tuple_call(e, vars_)
        if isinstance(e, ast.Ref):
            a = self.access(e, vars_)
            return Load(a, self.tensors[a.tensor].dtype, a.shape, e.loc)
        if isinstance(e, ast.Int):
            return Const(e.value, "i32", (), e.loc)
        if isinstance(e, ast.Float):
            return Const(e.value, "f32", (), e.loc)
        if isinstance(e, ast.Name):
            if e.id in self.consts:
                return Const(self.consts[e.id], "i32", (), e.loc)
            if e.id in vars_:  # a loop variable's value (an element offset) as an integer scalar
                return Idx(Affine(((e.id, 1),), 0), loc=e.loc)
            raise _Err(e.loc, f"unknown name '{e.id}'")
        if isinstance(e, ast.Neg):
            x = self.expr(e.operand, vars_)
            return Op("neg", (x,), "i32" if x.dtype == "i32" else "f32", x.shape, e.loc)
        if isinstance(e, ast.BinOp) and e.op == "@":
            a, b = self.expr(e.lhs, vars_), self.expr(e.rhs, vars_)
            shape = tile_ops.matmul(a.shape, b.shape)
            if isinstance(shape, str):
                raise _Err(e.loc, shape)
            if a.dtype != b.dtype:
                raise _Err(e.loc, f"dtype mismatch in '@': {a.dtype} @ {b.dtype} (cast one side, e.g. f32(x))")
            return Dot(a, b, "f32", shape, e.loc)
        if isinstance(e, ast.Attr):
            return self.attr(e, vars_)
        if isinstance(e, ast.BinOp):
            if e.op in ("%", "//"):  # index arithmetic (`_affine`) and integer constants only: no remainder in tiles
                try:
                    return Const(_const(e, self.consts, "'%' of constants"), "i32", (), e.loc)
                except _Err as err:
                    if err.msg == "division by zero":
                        raise
                raise _Err(e.loc, f"'{e.op}' is only for index and size arithmetic on dims, not in tile math (which has"
                                  " + - * / and functions)")
            a, b = self.expr(e.lhs, vars_), self.expr(e.rhs, vars_)
            shape = _broadcast(a.shape, b.shape, scalars=True)
            if shape is None:
                raise _Err(e.loc, f"shape mismatch in '{e.op}': {_shp(a.shape)} and {_shp(b.shape)}")
            ints = a.dtype == b.dtype == "i32" and e.op in "+-*"
            return Op(e.op, (a, b), "i32" if ints else "f32", shape, e.loc)
        if isinstance(e, ast.Call) and (e.kw or e.fn == "sum" or (e.fn in tile_ops.REDUCTIONS and len(e.args) == 1)):
            return self.reduction(e, vars_)
        if isinstance(e, ast.Call):
            args = [self.expr(x, vars_) for x in e.args]
            if e.fn in CASTS and len(args) == 1:
                return Op("cast_" + e.fn, tuple(args), e.fn, args[0].shape, e.loc)
            if e.fn in UNARY_FNS and len(args) == 1:
                return Op(e.fn, tuple(args), "f32", args[0].shape, e.loc)
            if e.fn in BINARY_FNS and len(args) == 2:
                shape = _broadcast(args[0].shape, args[1].shape, scalars=True)
                if shape is None:
                    raise _Err(e.loc, f"shape mismatch in {e.fn}(): {_shp(args[0].shape)} and {_shp(args[1].shape)}")
                ints = args[0].dtype == args[1].dtype == "i32"  # min(lens[b] - rank*S, S): a count stays an integer
                return Op(e.fn, tuple(args), "i32" if ints else "f32", shape, e.loc)
            known = sorted(UNARY_FNS | BINARY_FNS | CASTS)
            raise _Err(e.loc, f"unknown tile function '{e.fn}' with {len(args)} argument(s)"
                              f" (known: {', '.join(known)})")
        if isinstance(e, ast.Reduce):
            if e.var in vars_ or e.var in self.consts:
                raise _Err(e.loc, f"reduction variable '{e.var}' shadows another name")
            if problem := reserved_problem(e.var, "reduction variable"):
                raise _Err(e.loc, problem)
            if e.extent is None:
                v = Var(e.var, "rank", self.world, 1, e.loc)
            else:
                v = self._tile_var(e.var, e.extent, e.step, e.loc)
            body = self.expr(e.body, {**vars_, e.var: v})
            for ld in loads(body):  # a derived variable is computed once per task, outside every reduction
                for d in sorted(ld.access.vars):
                    x = self.pieces.vars.get(d)
                    if x is not None and x.derived is not None and e.var in peer_inputs({d}, self.pieces.vars):
                        raise _Err(ld.loc, f"'{x.derived}' in the read of '{ld.access.tensor}' uses the reduction"
                                           f" variable '{e.var}': peers and `%` / `//` pieces are computed once per"
                                           f" task, so they may use the stage's loops only (make '{e.var}' a loop"
                                           " of the stage)")
            if not any(e.var in ld.access.vars for ld in loads(body)):
                raise _Err(e.loc, f"'sum {e.var}' does not index any tensor with '{e.var}'")
            return Sum(v, body, "f32", body.shape, e.loc)
        raise _Err(e.loc, "unsupported expression")

    def attr(self, e: ast.Attr, vars_: dict[str, Var]) -> Op:
        """`x.T`: the transpose of a 2-d tile (ir/tile_ops.py)."""
        if e.name != "T":
            raise _Err(e.loc, f"a tile has no attribute '{e.name}' (tiles have `.T`, the transpose)")
        x = self.expr(e.value, vars_)
        shape = tile_ops.transpose(logical_shape(x))
        if isinstance(shape, str):
            raise _Err(e.loc, shape)
        return Op(tile_ops.PERMUTE, (x,), x.dtype, shape, e.loc, (1, 0))

    def _kwargs(self, e: ast.Call, allowed: tuple[str, ...]) -> dict[str, int]:
        out = {}
        for k, v in e.kw:
            if k not in allowed:
                raise _Err(v.loc, f"{e.fn}() has no argument '{k}'" + (f" (it takes {', '.join(allowed)})"
                                                                         if allowed else ""))
            if k in out:  # the second would silently win
                raise _Err(v.loc, f"{e.fn}() is given '{k}' twice")
            out[k] = _const(v, self.consts, f"{e.fn}'s {k}")
            if k == "keepdim" and out[k] not in (0, 1):  # a flag: any other number is a mistake, not "true"
                raise _Err(v.loc, f"{e.fn}(..., keepdim={out[k]}): keepdim is 0 or 1")
        return out

    def reduction(self, e: ast.Call, vars_: dict[str, Var]) -> TExpr:
        """`sum(x, dim=d)`, `max(x, dim=d)`, `min(x, dim=d)` (keepdim=1 keeps d as a dim of size 1)."""
        if e.fn not in tile_ops.REDUCTIONS:  # another function given a keyword
            self._kwargs(e, ())
        kw = self._kwargs(e, ("dim", "keepdim"))
        if "dim" not in kw or len(e.args) != 1:
            raise _Err(e.loc, f"{e.fn}(x, dim=d) reduces one tile along dim d"
                              + ("" if e.fn == "sum" else f"; {e.fn}(a, b) is the element-wise {e.fn}imum"))
        x = self.expr(e.args[0], vars_)
        shape = logical_shape(x)
        d = tile_ops.check_dim(e.fn, shape, kw["dim"])
        if isinstance(d, str):
            raise _Err(e.loc, d)
        keep = bool(kw.get("keepdim", 0))
        out = shape[:d] + (1,) * keep + shape[d + 1:]
        return Op(tile_ops.REDUCTIONS[e.fn], (x,), tile_ops.reduce_dtype(e.fn, x.dtype), out, e.loc, (d, int(keep)))

    def tuple_call(self, e: ast.Call, vars_: dict[str, Var]) -> TupleCall:
        fn = TILE_FNS[e.fn]
        args = tuple(self.expr(x, vars_) for x in e.args)
        dim = self._kwargs(e, ("dim",) if e.fn == "lse_merge" else ()).get("dim", 0)
        if dim and len(args) == 2:  # lse_merge(o, lse, dim=d): the partials' dim d taken to the front
            d = tile_ops.check_dim(e.fn, logical_shape(args[1]), dim)
            if isinstance(d, str):
                raise _Err(e.loc, d)
            perms = [tile_ops.to_front(len(logical_shape(a)), d) for a in args]
            args = tuple(Op(tile_ops.PERMUTE, (a,), a.dtype, tile_ops.permuted(logical_shape(a), p), a.loc, p)
                         for a, p in zip(args, perms, strict=True))
        outs = fn.check([logical_shape(a) for a in args], args)
        if isinstance(outs, str):
            raise _Err(e.loc, outs)
        return TupleCall(fn.name, args, outs, e.loc)

    # -- ordering: what may be read where --------------------------------------------------------
    def conflict(self, s1: StageIR, st1: Store, s2: StageIR, st2: Store) -> str | None:
        return _conflict(self.world, self.tensors, s1, st1, s2, st2)

    def read_race(self, it: StageIR, st: Store, ld: Load, stores: list) -> str | None:
        """A read of elements that another rank's task of an earlier stage of this phase stores (exactly: the
        elements both reach, ir/regions.py), or None; a write and a read of one rank both local are ordered."""
        from tilec.ir import regions
        from tilec.ir.types import reduction_vars

        me = {ME: Var(ME, "me", self.world, 1, it.loc)}
        a = ld.access
        shape = self.tensors[a.tensor].shape
        scope = {v.name: v for v in it.loops} | me | {v.name: v for v in reduction_vars(st.value)}
        for other, ost in stores:
            if not (a.remote or ost.access.remote):
                continue
            try:
                p = regions.common(regions.region(a, scope, self.world, shape),
                                   regions.region(ost.access, {v.name: v for v in other.loops} | me, self.world,
                                                  shape))
            except regions.Undecidable as e:
                return (f"cannot prove that stage '{it.name}' reads '{a}' apart from what stage '{other.name}' stores"
                        f" in the same phase on another rank ({e}); rewrite with a `barrier` between them")
            if p is not None:
                return (f"race: stage '{it.name}' reads '{a}' which stage '{other.name}' writes in the same phase on"
                        f" another rank ({a.tensor}[{', '.join(map(str, p[1:]))}] on rank {p[0]}); put a `barrier`"
                        " between them")
        return None

    def reads_own_writes(self, it: StageIR, st: Store, ld: Load) -> bool:
        """Whether some task of stage `it` reads an element of `ld`'s tensor that a task of it stores, on any rank
        (exactly: ir/regions.py; a question too large to decide counts as yes)."""
        from tilec.ir import regions
        from tilec.ir.types import reduction_vars

        me = {ME: Var(ME, "me", self.world, 1, it.loc)}
        shape = self.tensors[ld.access.tensor].shape
        scope = {v.name: v for v in it.loops} | me | {v.name: v for v in reduction_vars(st.value)}
        try:
            want = regions.region(ld.access, scope, self.world, shape)
            return any(regions.common(want, regions.region(x.access, {v.name: v for v in it.loops} | me, self.world,
                                                           shape)) is not None
                       for x in it.body if x.access.tensor == ld.access.tensor)
        except regions.Undecidable:
            return True

    def phases(self, items: list[StageIR | BarrierIR]) -> None:
        written_before: set[str] = set()  # by stages in earlier phases
        phase_writes: dict[str, tuple[str, bool]] = {}  # tensor -> (first stage, written remotely by any)
        phase_stores: dict[str, list[tuple[StageIR, Store]]] = {}  # tensor -> its stores in this phase
        for it in items:
            if isinstance(it, BarrierIR):
                written_before |= set(phase_writes)
                phase_writes, phase_stores = {}, {}
                continue
            written_here = {st.access.tensor for st in it.body}
            for st in it.body:
                for ld in loads(st.value):
                    a, name = ld.access, ld.access.tensor
                    t = self.tensors[name]
                    if name in written_here and it.name in self.steps and self.reads_own_writes(it, st, ld):
                        # already a ring: the loop-over-steps hint would be wrong, and every step would repeat it
                        orig, var = self.steps[it.name]
                        if (orig, ld.loc) not in self._raced_steps:
                            self._raced_steps.add((orig, ld.loc))
                            self.err(ld.loc, f"stage '{orig}' reads '{name}' where the same step writes it (step"
                                             f" {var} = {it.name.rsplit('_', 1)[1]}, on this rank or another): tasks"
                                             f" would race; a step may only read what step {var} - 1 wrote")
                        continue
                    if name in written_here and it.name not in self.steps:
                        self.err(ld.loc, f"stage '{it.name}' reads '{name}', which it also writes: tasks would race"
                                         " on it; write the result to another tensor (or loop over steps first,"
                                         " `s in ranks` or `s in W - 1 by 1`: step s may read step s - 1)")
                        continue
                    if t.kind != "in" and name not in written_before and name not in phase_writes:
                        self.err(ld.loc, f"stage '{it.name}' reads '{name}' before any stage writes it")
                    elif name in phase_writes and (a.remote or phase_writes[name][1]):
                        why = self.read_race(it, st, ld, phase_stores[name])
                        if why:
                            self.err(ld.loc, why)
            for st in it.body:
                name = st.access.tensor
                for other, ost in phase_stores.get(name, ()):
                    why = self.conflict(other, ost, it, st) if other.name != it.name else None
                    if why:
                        self.err(st.loc, why)
                        break
                phase_stores.setdefault(name, []).append((it, st))
                phase_writes[name] = (phase_writes.get(name, (it.name, False))[0],
                                      st.access.remote or phase_writes.get(name, ("", False))[1])
        written = written_before | set(phase_writes)
        for t in self.tensors.values():
            if t.kind == "out" and t.name not in written:
                self.err(t.loc, f"output '{t.name}' is never written")


def _conflict(world: int, tensors: dict, s1: StageIR, st1: Store, s2: StageIR, st2: Store) -> str | None:
    """Whether two stages of one phase store one element of one rank's copy (exactly, over every task on every
    rank: ir/regions.py): the message, or None when their elements are disjoint."""
    from tilec.ir import regions

    me = Var(ME, "me", world, 1, s1.loc)
    shape = tensors[st1.access.tensor].shape
    a, b = st1.access, st2.access
    try:
        p = regions.common(regions.region(a, {v.name: v for v in s1.loops} | {ME: me}, world, shape),
                           regions.region(b, {v.name: v for v in s2.loops} | {ME: me}, world, shape))
    except regions.Undecidable as e:
        return (f"cannot prove that stages '{s1.name}' and '{s2.name}' store disjoint elements of '{a.tensor}' ({e});"
                " rewrite as one stage, or put a `barrier` between them")
    if p is None:
        return None
    elem = f"{a.tensor}[{', '.join(map(str, p[1:]))}] on rank {p[0]}"
    return (f"write conflict: stages '{s1.name}' and '{s2.name}' both write {elem} ({a} and {b}) with no barrier"
            " between them")


def _names(e: ast.Expr):
    if isinstance(e, ast.Name):
        yield e
    for f in ("lhs", "rhs", "operand", "body"):
        if hasattr(e, f):
            yield from _names(getattr(e, f))


def _check_tile(shape, loc: Loc) -> None:
    if math.prod(shape) > MAX_TILE:
        raise _Err(loc, f"a {_shp(shape)} tile has {math.prod(shape)} elements: too many (tilec's limit is 2**24 ="
                        f" {MAX_TILE} per tile; use smaller tiles)")


def _integer(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)  # numpy ints yes; True, 2.0, "256" no


def check_arguments(world, dims) -> tuple[int, dict[str, int]]:
    """`world` and `dims` as a caller gave them, as plain ints; ArgumentError naming the bad one."""
    if not _integer(world):
        raise ArgumentError(f"world={world!r}: must be an integer number of ranks, not {type(world).__name__}")
    if not 1 <= world <= MAX_WORLD:
        raise ArgumentError(f"world={world}: must be >= 1 and <= {MAX_WORLD} (tilec's limit)")
    if dims is None:
        return int(world), {}
    if not isinstance(dims, Mapping):
        raise ArgumentError(f"dims={dims!r}: must be a dict of dim or tile names to integers")
    for k, v in dims.items():
        if not isinstance(k, str):
            raise ArgumentError(f"dims: key {k!r} is not a dim or tile name")
        if not _integer(v):
            raise ArgumentError(f"dims[{k!r}] = {v!r}: must be an integer, not {type(v).__name__}")
    return int(world), {k: int(v) for k, v in dims.items()}


def _shp(s: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, s)) + "]"


def _broadcast(a: tuple[int, ...], b: tuple[int, ...], scalars: bool = False) -> tuple[int, ...] | None:
    """The shape of an element-wise operation on tiles of shapes a and b (None: they do not fit): numpy's rule
    (ir/tile_ops.py)."""
    return tile_ops.broadcast(a, b)


def check(prog: ast.Program, world: int, dims: dict[str, int] | None = None) -> BoundProgram:
    """Resolve and check `prog` for `world` ranks; raises CompileError with every problem found."""
    world, dims = check_arguments(world, dims)
    c = _Checker(prog, world, dims)
    c.declare()
    items: list[StageIR | BarrierIR] = []
    names: set[str] = set()
    stepped: set[str] = set()  # tensors written by forwarding stages
    for item in prog.items:
        try:  # a stage that forwards what it received runs step by step (frontend/steps.py)
            steps = ring_steps(item, c.consts, world, stepped) if isinstance(item, ast.Stage) else None
        except NotAffine as x:
            c.err(x.loc, x.msg)
            steps = None
        if steps is not None and forwards(item):
            stepped |= {t.tensor for a in item.body for t in a.targets if t is not None}
            c.steps |= {x.name: (item.name, item.loops[0].var) for x in steps if isinstance(x, ast.Stage)}
        for it in [item] if steps is None else steps:
            if isinstance(it, ast.Barrier):
                items.append(BarrierIR(it.loc))
                continue
            if it.name in names:
                c.err(it.loc, f"stage '{it.name}' is already defined")
            names.add(it.name)
            items.append(c.stage(it))
    if not any(isinstance(i, StageIR) for i in items):
        c.err(prog.loc, "program has no stages")
    if not c.errors:
        c.phases(items)
        c.errors += tile_problems(items)  # the target's limits: Triton would refuse these tiles when it builds
    c.drop_cascades(prog.source)
    if c.errors:
        errors = [_in_words(d, c.tensors, prog.source) for d in c.errors]
        raise CompileError(sorted(errors, key=lambda d: (d.loc.line, d.loc.col)), prog.source)
    return BoundProgram(prog.name, world, prog.world, tuple(c.dims), tuple(c.tiles), tuple(c.tensors.values()),
                        tuple(items), prog.loc.file, prog.source)
