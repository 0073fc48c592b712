"""The reference interpreter: a program's meaning evaluated directly with torch, stage by stage, with real barriers.

Independent of the passes and of codegen: it walks the checked program (not the graph), task by task, slicing
tiles (clipped at the edges instead of masked) and doing all arithmetic in f32, storing in the tensor's dtype.
Every rank's state is held here, so `X@r[...]` simply reads rank r's copy.
"""

from __future__ import annotations

import itertools
import math

import torch

from tilec.errors import IndexRangeError
from tilec.frontend.sema import BarrierIR, BoundProgram, StageIR
from tilec.ir import tile_ops
from tilec.ir.builtins import TILE_FNS
from tilec.ir.dtypes import DTYPES, torch_dtype
from tilec.ir.gather import Counted, check_number, range_message
from tilec.ir.types import ME, Access, Const, Dot, Idx, Load, Op, Sum, TupleCall, Var, loads

TORCH_DTYPE = {d: torch_dtype(d) for d in DTYPES}
_FNS = {
    "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt, "abs": torch.abs, "relu": torch.relu,
    "sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": torch.nn.functional.silu, "neg": torch.neg,
}


def _slices(a: Access, env: dict[str, int], scope: dict[str, Var]) -> tuple[slice, ...]:
    out = []
    for aff, tv in zip(a.index, a.tile, strict=True):
        start = aff.const + sum(k * env[v] for v, k in aff.terms)
        n = min(scope[tv].step, scope[tv].extent - env[tv]) if tv else 1
        if tv and f"#{tv}" in env:  # a counted loop (ir/gather.py): its rows past the count are not there
            n = max(0, min(n, env[f"#{tv}"] - env[tv]))
        out.append(slice(start, start + n))
    return tuple(out)


class Reference:
    def __init__(self, prog: BoundProgram, inputs: list[dict[str, torch.Tensor]], device: str = "cpu",
                 outputs_start: dict[str, torch.Tensor] | None = None):
        self.prog = prog
        self.state: list[dict[str, torch.Tensor]] = []
        for r in range(prog.world):
            st = {}
            for t in prog.tensors:
                if t.kind == "in":
                    st[t.name] = inputs[r][t.name].detach().to(device, TORCH_DTYPE[t.dtype]).clone()
                elif t.kind == "out" and outputs_start is not None:
                    st[t.name] = outputs_start[t.name].to(device, TORCH_DTYPE[t.dtype]).expand(t.shape).clone()
                else:
                    st[t.name] = torch.zeros(t.shape, dtype=TORCH_DTYPE[t.dtype], device=device)
            self.state.append(st)

    def run(self) -> list[dict[str, torch.Tensor]]:
        phase: list[StageIR] = []
        for it in (*self.prog.items, BarrierIR(None)):
            if isinstance(it, BarrierIR):
                for st in phase:  # stage order on every rank; no cross-rank reads of this phase's writes (sema)
                    for r in range(self.prog.world):
                        self._stage(st, r)
                phase = []
            else:
                phase.append(it)
        return self.state

    def _stage(self, st: StageIR, rank: int) -> None:
        scope = {v.name: v for v in st.loops} | {ME: Var(ME, "me", self.prog.world, 1, st.loc)}
        ranges = [range(0, v.extent, v.step) for v in st.loops]
        claimed: dict[tuple, set[int]] = {}  # a scatter's rows written so far (they must be distinct)
        for vals in itertools.product(*ranges):
            env = dict(zip((v.name for v in st.loops), vals, strict=True)) | {ME: rank}
            env |= {f"#{v.name}": self._count(v, env) for v in st.loops if isinstance(v, Counted)}
            for v in st.loops:  # peers and index pieces: computed from the others (ir/peers.py)
                if v.derived is not None:
                    env[v.name] = v.derived.evaluate(env)
            done: dict[int, object] = {}  # a tile function's results, shared by the stores of its outputs
            for s in st.body:
                if id(s.value) not in done:
                    done[id(s.value)] = self._eval(s.value, env, scope)
                val = done[id(s.value)]
                a = s.access
                dst = self.state[env[a.rank]][a.tensor]
                sl = _slices(a, env, scope)
                if getattr(a, "rows", ()):  # a scatter (ir/gather.py): distinct rows of this stage's call
                    # claimed with the task's start in the other dims: the tasks that split a row write it once each
                    other = tuple(x.start for d, x in enumerate(sl) if d != a.rows[0].dim)
                    self._scatter(a, env, scope, val, dst[sl], claimed.setdefault((a.tensor, other), set()))
                    continue
                region = dst[sl]
                if s.part is not None:
                    val = val[s.part].reshape(region.shape)
                elif val.dim() > region.dim():  # the same tile up to unit dims
                    val = val.reshape(region.shape)
                elif [n for n in val.shape if n != 1] == [n for n in region.shape if n != 1]:
                    val = val.reshape(region.shape)  # the same tile with its unit dims elsewhere: Z[r, m] = Y[m, 0]
                elif val.dim() == region.dim() and any(a > b for a, b in zip(val.shape, region.shape, strict=True)):
                    val = val[tuple(slice(0, n) for n in region.shape)]  # a padded sum, stored where the tile fits
                dst[sl] = torch.broadcast_to(val, region.shape).to(dst.dtype)

    def _rows(self, r, a, env, scope):
        vals = self.state[env[ME]][r.index.tensor][_slices(r.index, env, scope)].long()
        bad = ((vals < 0) | (vals >= r.size)).nonzero()
        if len(bad):
            j = int(bad[0, 0])
            self._range_error(r.index.tensor, r.loc, _slices(r.index, env, scope)[0].start + j, int(vals[j]), env)
        return vals

    def _scatter(self, a, env, scope, val, region, claimed: set[int]) -> None:
        (r,) = a.rows
        rows = self._rows(r, a, env, scope)
        first = _slices(r.index, env, scope)[0].start
        for j, v in enumerate(rows.tolist()):
            if v in claimed:
                number = check_number(self.prog.items, r.index.tensor, r.loc, "unique")
                raise IndexRangeError(range_message(self.prog.items, number, first + j, v, env[ME], self.prog.name),
                                      tensor=r.index.tensor, element=first + j, value=v, rank=env[ME])
            claimed.add(v)
        shape = list(region.shape)
        shape[r.dim] = len(rows)
        val = val.reshape(shape) if val.numel() == math.prod(shape) else torch.broadcast_to(val, shape)
        region.index_copy_(r.dim, rows, val.to(region.dtype))

    def _count(self, v: Var, env) -> int:
        a = v.count
        pos = a.index[0].const + sum(k * env[x] for x, k in a.index[0].terms)
        n = int(self.state[env[ME]][a.tensor][pos])
        if not 0 <= n <= v.extent:
            self._range_error(a.tensor, a.loc, pos, n, env)
        return n

    def _range_error(self, tensor: str, loc, element: int, value: int, env):
        number = check_number(self.prog.items, tensor, loc)
        raise IndexRangeError(range_message(self.prog.items, number, element, value, env[ME], self.prog.name),
                              tensor=tensor, element=element, value=value, rank=env[ME])

    def _device(self):
        return self.state[0][self.prog.tensors[0].name].device

    def _eval(self, e, env, scope) -> torch.Tensor:
        if isinstance(e, Load):
            a = e.access
            x = self.state[env[a.rank]][a.tensor][_slices(a, env, scope)].float()
            for r in getattr(a, "rows", ()):  # data-dependent rows: those the index tile names
                x = x.index_select(r.dim, self._rows(r, a, env, scope))
            return x
        if isinstance(e, Const):
            return torch.tensor(float(e.value), device=self._device())
        if isinstance(e, Idx):
            return torch.tensor(float(e.index.const + sum(k * env[v] for v, k in e.index.terms)),
                                device=self._device())
        if isinstance(e, TupleCall):
            args = [_logical(self._eval(a, env, scope), a) for a in e.args]
            return TILE_FNS[e.fn].reference(*args)
        if isinstance(e, Dot):
            a, b = self._eval(e.lhs, env, scope).float(), self._eval(e.rhs, env, scope).float()
            return _matrix(a, e.lhs) @ _matrix(b, e.rhs)
        if isinstance(e, Sum):
            v = e.var
            if _contracts_only(e):  # sum over k of A[., k] @ B[k, .] is one matmul over the whole k range
                whole = Var(v.name, v.kind, v.extent, v.extent, v.loc)
                return self._eval(e.body, env | {v.name: 0}, scope | {v.name: whole})
            inner = scope | {v.name: v}
            acc = None
            for x in range(0, v.extent, v.step):
                t = self._eval(e.body, env | {v.name: x}, inner)
                if not isinstance(e.body, Dot):  # a GEMM contracts v; other bodies keep its dims
                    t = _pad_tile(t, e.body, v)
                acc = t if acc is None else acc + t
            return acc
        if isinstance(e, Op):
            args = [self._eval(a, env, scope) for a in e.args]
            if e.op in "+-*/":
                return {"+": torch.add, "-": torch.sub, "*": torch.mul, "/": torch.div}[e.op](*args)
            if e.op in ("max", "min"):
                return (torch.maximum if e.op == "max" else torch.minimum)(*args)
            if e.op.startswith("cast_"):
                return args[0].to(TORCH_DTYPE[e.dtype]).float()
            if e.op in tile_ops.OPS:
                return tile_ops.reference(e.op, e.attr, _as_logical(args[0], e.args[0]))
            return _FNS[e.op](args[0])
        raise TypeError(f"reference: unsupported expression {type(e).__name__}")


def _pad_tile(t: torch.Tensor, body, v: Var) -> torch.Tensor:
    """A term of a sum over tile loop v, zero-padded to v's whole step along the dims v tiles: the last tile of a
    ragged loop is clipped, and its missing elements add nothing (the kernel masks them)."""
    dims = {d for ld in loads(body) for d, tv in enumerate(ld.access.tile) if tv == v.name}
    if t.dim() != len(body.shape):
        return t
    pad = []
    for d in reversed(range(t.dim())):
        pad += [0, v.step - t.shape[d] if d in dims and t.shape[d] < v.step else 0]
    return torch.nn.functional.pad(t, pad) if any(pad) else t


def _logical(x: torch.Tensor, e) -> torch.Tensor:
    """The tile as tile functions see it: a load keeps its tile/`:` dims; other values drop extent-1 dims."""
    if isinstance(e, Load):
        return x.reshape([n for n, tv in zip(x.shape, e.access.tile, strict=True) if tv is not None])
    return x.reshape([n for n in x.shape if n != 1])


def _as_logical(x: torch.Tensor, e) -> torch.Tensor:
    """Tile x of expression e with the dims that are not e's logical dims dropped (by e's shape, not x's: the last
    tile of a ragged loop may have one row)."""
    if isinstance(e, Load):
        return _logical(x, e)
    if x.dim() != len(e.shape):
        return x
    return x.reshape([n for n, s in zip(x.shape, e.shape, strict=True) if s != 1])


def _matrix(x: torch.Tensor, e) -> torch.Tensor:
    """An operand of `@` as a matrix: a tile of more than 2 dims loses its leading dims (of size 1)."""
    return x.reshape(x.shape[-2:]) if x.dim() > 2 else x


def _contracts_only(e: Sum) -> bool:
    """A tile-loop sum of a matmul of two loads whose only use of the loop is the contracted dimension."""
    b, v = e.body, e.var.name
    if e.var.is_rank or not isinstance(b, Dot) or not isinstance(b.lhs, Load) or not isinstance(b.rhs, Load):
        return False
    lhs, rhs = b.lhs.access, b.rhs.access
    uses = [(a, d) for a in (lhs, rhs) for d, aff in enumerate(a.index) if v in aff.vars]
    return uses == [(lhs, 1), (rhs, 0)] and lhs.tile[1] == v and rhs.tile[0] == v and v not in (lhs.rank, rhs.rank)


def evaluate(prog: BoundProgram, inputs: list[dict[str, torch.Tensor]], device: str = "cpu",
             outputs_start: dict[str, torch.Tensor] | None = None) -> list[dict[str, torch.Tensor]]:
    """Every tensor of every rank after running `prog` on `inputs` (one dict of input tensors per rank). Outputs
    start as zeros, or as `outputs_start[name]` (a value broadcast to the output's shape): what a call leaves in the
    elements the program does not write."""
    return Reference(prog, inputs, device, outputs_start).run()
