"""Emitting tile math: expressions, GEMMs (tl.dot), reductions (sums over tiles and ranks), attend and lse_merge."""

from __future__ import annotations

from tilec.errors import TilecError
from tilec.ir.builtins import TILE_FNS
from tilec.ir.dtypes import TL_DTYPE
from tilec.ir.gather import Gathered
from tilec.ir.graph import InPlace, Pull, program_of, tensor
from tilec.ir.tiling import invert
from tilec.ir.types import ME, Const, Dot, Idx, Load, Op, Sum, TupleCall, Var, logical_shape, walk

from . import build, tile_ops
from . import kir as K
from .build import At, E, add, assign, bcast, call, cmp, sub, to, tup
from .copies import tile_name
from .text import row_major_strides

_OP_NAMES = {"+": "add", "-": "sub", "*": "mul", "/": "div"}
# the element-wise functions of tile math (sema's UNARY_FNS and neg), each on its argument's kernel-IR node
UNARY = {
    "exp": lambda x: call("tl.exp", x), "log": lambda x: call("tl.log", x), "sqrt": lambda x: call("tl.sqrt", x),
    "abs": lambda x: call("tl.abs", x), "relu": lambda x: call("tl.maximum", x, 0.0),
    "sigmoid": lambda x: call("tl.sigmoid", x), "silu": lambda x: K.Bin("*", x, call("tl.sigmoid", x)),
    "tanh": lambda x: K.Bin("-", K.Bin("*", E(2.0), call("tl.sigmoid", K.Bin("*", E(2.0), x))), E(1.0)),
    "neg": lambda x: K.Unary("-", x),
}


def op_name(e: Op) -> str:
    """What an operation's result is called: `exp_tile`, `sub_val` (a scalar), `cast_tile`."""
    op = "cast" if e.op.startswith("cast_") else _OP_NAMES.get(e.op, e.op)
    return f"{op}_{'tile' if any(n > 1 for n in e.shape) else 'val'}"


class Compute:
    """Mixin of _Emitter (emit.py): the value of a tile expression, with the kernel-IR statements that compute it."""

    def local_pull(self, e) -> bool:
        """A pull from this rank's own memory whose copy solves no rank (one rank: local-in-place removed the copy):
        its pointers walk along a reduction as a load's do."""
        if not isinstance(e, Pull) or isinstance(e, InPlace) or e.source.rank != ME or e.read.rank != ME:
            return False
        world = program_of(self.g).world
        loops = {x.name: x for x in e.producer} | {ME: Var(ME, "me", world, 1, e.loc)}
        return all(d.rank_var is None for d in invert(e.write, loops, set(), world, "pull"))

    def in_place_steps(self, e: Pull, v: Var) -> tuple[int, int] | None:
        """How far an in-place read's source and buffer pointers move per step of reduction var v, or None when
        they do not move by a constant (v solves a rank, or the copy's tiles leave gaps along v)."""
        world = program_of(self.g).world
        dims = invert(e.write, {x.name: x for x in e.producer} | {ME: Var(ME, "me", world, 1, e.loc)}, set(), world,
                      "in place")
        src_st = row_major_strides(tensor(self.g, e.source.tensor).shape)
        buf = next(t for t in program_of(self.g).tensors if t.name == e.read.tensor)  # a pull's is gone
        buf_st = row_major_strides(buf.shape)
        inc_src = inc_buf = 0
        for d, aff in enumerate(e.read.index):
            k = aff.coef(v.name)
            if not k:
                continue
            inv = dims[d]
            span = e.read.shape[d]
            if inv.rank_var or inv.tile_var is None or inv.extent % span or (aff.const - inv.const) % span or \
                    e.read.tile[d] not in (None, v.name):
                return None
            inc_buf += k * v.step * buf_st[d]
            inc_src += sum(a.coef(inv.tile_var) * k * v.step * s for a, s in zip(e.source.index, src_st, strict=True))
        return (inc_src, inc_buf) if inc_buf else None

    def expr(self, e, out: list, indent: str):
        """The value of tile expression e (a kernel-IR expression; a tile function's: the tuple of its results),
        with the statements that compute it placed in `out` at `indent`."""
        if isinstance(e, Const):
            lit = E(int(e.value) if e.dtype == "i32" else float(e.value))
            if any(s.value is e for s in self.st.body):  # stored as is: broadcast needs a tensor, not a literal
                name = self.tmp("const_val")
                out.append(At(indent, assign(name, call("tl.full", tup(), lit, TL_DTYPE[e.dtype]))))
                return E(name)
            return lit
        if isinstance(e, Idx):
            return self.scalar(e.index.terms, e.index.const)
        if isinstance(e, TupleCall):
            return self.tuple_call(e, out, indent)
        if isinstance(e, Load):
            return self.load(e, out, indent)
        if isinstance(e, Pull) and id(e) in self.walked:
            ptrs, mask, _own = self.walked[id(e)]
            name = self.tmp(tile_name(e.read.tensor if isinstance(e, InPlace) else e.source.tensor, e.shape))
            kw = {"mask": mask, "other": 0} if mask is not None else {}
            out.append(At(indent, assign(name, call("load", ptrs, **kw))))
            return E(name)
        if isinstance(e, Pull):
            return self.pull(e, out, indent)
        if isinstance(e, Op):
            self.sums_in_one_loop(e, out, indent)
            args = [self.expr(a, out, indent) for a in e.args]
            if e.dtype == "f32":  # tile math is f32; integer scalars (lengths, offsets) stay integers; an i32(x) tile
                # in f32 math is converted back
                args = [to(a, "tl.float32") if isinstance(x, Load | Pull) or (isinstance(x, Op) and x.dtype == "i32")
                        else a for a, x in zip(args, e.args, strict=True)]
            if len(e.args) == 2:  # numpy broadcasting: a tile of lower rank gets leading axes of size 1
                args = [tile_ops.padded(a, x, len(e.shape)) for a, x in zip(args, e.args, strict=True)]
            if tile_ops.is_tile_op(e):
                r = tile_ops.emit(self, e, args[0])
            elif e.op in "+-*/":
                r = K.Bin(e.op, args[0], args[1])
            elif e.op in ("max", "min"):
                r = call(f"tl.{e.op}imum", args[0], args[1])
            elif e.op.startswith("cast_"):  # a literal has no .to(): make it a scalar tensor first
                src = call("tl.full", tup(), args[0], "tl.float32") if isinstance(e.args[0], Const) else args[0]
                r = to(src, TL_DTYPE[e.dtype])
            else:
                r = UNARY[e.op](args[0])
            name = self.tmp(op_name(e))
            out.append(At(indent, assign(name, r)))
            return E(name)
        if isinstance(e, Dot):
            a, b = self.expr(e.lhs, out, indent), self.expr(e.rhs, out, indent)
            a, b = tile_ops.matrix(a, e.lhs), tile_ops.matrix(b, e.rhs)
            name = self.tmp("prod")
            out.append(At(indent, assign(name, self.dot(e, a, b, None))))
            return E(name)
        if isinstance(e, Sum):
            return self.fused_sums.pop(id(e), None) or self.sum(e, out, indent)
        raise TilecError(f"codegen: unsupported expression {type(e).__name__}")

    def tuple_call(self, e: TupleCall, out: list, indent: str) -> tuple[K.Expr, ...]:
        """A tile-library function (tilec.ir.builtins): its device call on canonical shapes, once per task; an attend
        over a long key tile read from memory is streamed instead."""
        if id(e) in self.memo:
            return self.memo[id(e)]
        if e.fn == "attend" and self._streamable(e):
            self.memo[id(e)] = self.attend_streamed(e, out, indent)
            return self.memo[id(e)]
        args = [self.expr(a, out, indent) for a in e.args]
        o, lse = self.tmp("o"), self.tmp("lse")
        out.append(At(indent, TILE_FNS[e.fn].emit(self, e, args, (o, lse))))
        self.memo[id(e)] = (E(o), E(lse))
        return self.memo[id(e)]

    # the kernel-IR constructors, for the tile functions' emit (tilec.ir.builtins: they do not import codegen)
    kb = build

    def _streamable(self, e: TupleCall) -> bool:
        """attend over a key tile longer than one block, with k and v read straight from memory: stream it."""
        k, v = e.args[1], e.args[2]
        if not all(isinstance(x, Load) and not x.access.remote and x.access not in self.ptrs for x in (k, v)):
            return False
        kt, vt = ([t for t in x.access.tile if t] for x in (k, v))
        if len(kt) != 2 or len(vt) != 2 or kt[0] != vt[0] or kt[0] in self.loop_vars:
            return False
        pos = self.scope[kt[0]]
        d = logical_shape(k)[-1]
        return pos.step > self.attend_block and pos.step % self.attend_block == 0 and d >= 16

    def attend_streamed(self, e: TupleCall, out: list, indent: str) -> tuple[K.Expr, K.Expr]:
        """attend(q, k, v, n) as a loop over blocks of attend_block keys with online softmax: k and v stream
        through the pipelined loop (block loads masked past n, so short sequences read less) instead of one
        tile held whole in registers."""
        q = self.expr(e.args[0], out, indent)
        n = self.expr(e.args[3], out, indent)
        qs = logical_shape(e.args[0])
        mq = qs[0] if len(qs) == 2 else 1
        k, v = e.args[1], e.args[2]
        pos = self.scope[[t for t in k.access.tile if t][0]]
        if self.rows_valid(k) is not None:
            clamped = self.tmp("n_keys")
            out.append(At(indent, assign(clamped, self.key_count(k, n))))
            n = E(clamped)
        scale = 1.0 / (self.extent_of_last(k) ** 0.5)
        qp, mx, den, acc = self.tmp("q_pad"), self.tmp("row_max"), self.tmp("den"), self.tmp("acc")
        out.append(At(indent, assign(tup(qp, mx, den, acc), call("td.attend_init", call("tl.reshape", q,
                                                                                       tup(mq, qs[-1]))))))
        c = self.tmp("kb")
        blk = self.attend_block
        # a one-trip tile shorter than its step stops at its extent: the blocks past it are padding
        span = -(-pos.extent // blk) * blk if pos.extent < pos.step else pos.step
        out.append(At(indent, K.For(c, E(0), E(span), E(blk), (), "blocks of keys")))
        inner = indent + "    "
        rng = f"{c}_r"
        out.append(At(inner, assign(rng, add(pos.name, c, call("tl.arange", 0, blk)))))
        tiles = []
        for x in (k, v):
            a = x.access
            for w in self.waits.pop(a, []):
                self.wait(w, out, indent)
            # a [keys, D] block (pos is the first tile dim: _streamable) with no unit axes: reshaping a
            # [1, 1, keys, D] load before the dot cost the H200 10-15% of its streaming rate once v fed the dot
            # straight from shared memory
            off, mask = self.offsets(a, ranges={pos.name: rng}, squeeze=True)
            live = bcast(cmp(add(c, call("tl.arange", 0, blk)), "<", n), 0, 2)
            mask = live if mask is None else K.Bin("&", mask, live)
            name = self.tmp(tile_name(a.tensor, (blk,)))
            out.append(At(inner, assign(name, call("load", add(self.param(a.tensor), off), mask=mask, other=0))))
            tiles.append(name)
        # loads masked past n: rows are 0
        out.append(At(inner, assign(tup(mx, den, acc), call("td.attend_step", qp, tiles[0], tiles[1], sub(n, c), mx,
                                                             den, acc, scale, "INTERPRET", True))))
        o, lse = self.tmp("o"), self.tmp("lse")
        out.append(At(indent, assign(tup(o, lse), call("td.attend_finish", mx, den, acc, mq))))
        return E(o), E(lse)

    def extent_of_last(self, x) -> int:
        """The true (unpadded) extent of a load's last tile dim (e.g. the head dim D)."""
        tv = [t for t in x.access.tile if t][-1]
        return self.scope[tv].extent

    def key_count(self, k, n: K.Expr) -> K.Expr:
        """attend's count n of valid keys, clamped to the real rows of a padded key tile k (its masked rows load as
        zeros, which are not keys)."""
        rows = self.rows_valid(k)
        return n if rows is None else call("tl.minimum", n, rows)

    def rows_valid(self, x) -> K.Expr | None:
        """How many rows of a load's first tile dim are real, where the tile is padded: the extent of a one-trip
        tile var shorter than its step (`p in 40 by 64`), `min(step, extent - start)` of a ragged multi-trip one;
        None where every row is. Row-wise reductions (attend's keys, lse_merge's partials) must skip the padding:
        masked loads give 0 there, which is a real key or partial to them."""
        lead = 0
        if tile_ops.is_tile_op(x):  # lse_merge(o, lse, dim=d): the partials' dim d taken to the front of a load
            lead, x = x.attr[0], x.args[0]
        v = self.scope[[t for t in x.access.tile if t][lead]]
        if v.extent % v.step == 0:
            return None
        if v.extent < v.step:
            return E(v.extent)
        return call("tl.minimum", sub(v.extent, v.name), v.step)

    def dot(self, e: Dot, a: K.Expr, b: K.Expr, acc: K.Expr | None) -> K.Call:
        ieee = e.lhs.dtype == "f32"
        return call("dot", a, b, K.Const(None) if acc is None else acc, "INTERPRET", ieee)

    def sum(self, e: Sum, out: list, indent: str) -> K.Expr:
        acc = self.tmp("acc")
        shape = tup(*e.shape) if e.shape else E(1)
        out.append(At(indent, assign(acc, call("tl.zeros", shape, dtype="tl.float32"))))
        v = e.var
        self.scope[v.name] = v
        inner = indent + "    "
        steps: list = []
        if not v.is_rank:
            # local tiles walked along the reduction: pointers set up once, then advanced (as hand-written GEMMs do)
            walked = [x for x in _direct_loads(e.body) if isinstance(x, Load) and not x.access.remote
                      and v.name in x.access.vars and not isinstance(x.access, Gathered)]
            in_place = [(x, inc) for x in _direct_loads(e.body) if isinstance(x, InPlace) or self.local_pull(x)
                        for inc in [self.in_place_steps(x, v)] if inc]
            if walked or in_place:
                out.append(At(indent, assign(f"{v.name}_r", call("tl.arange", 0, v.step), f"{v.name} = 0")))
            for x, (inc_src, inc_buf) in in_place:  # this rank's rows or a peer's: one pointer walks either
                ptrs, mask, own = self.pull(x, out, indent, walk=v.name)
                self.walked[id(x)] = (ptrs, mask, own)
                inc = E(inc_src) if inc_src == inc_buf or own is None else call("tl.where", own, inc_src, inc_buf)
                steps.append(At(inner, K.AugAssign(K.Name(ptrs), "+", inc)))
            steps += [self.walk_pointer(x.access, v, out, indent) for x in walked]
        self.loop_vars.add(v.name)
        if v.is_rank:
            out.append(At(indent, K.For(v.name, E(0), E(self.world), None, ())))
        else:
            out.append(At(indent, K.For(v.name, E(0), E(v.extent), E(v.step), ())))
            self.bind_tile(v, out, inner)
        ragged = not v.is_rank and v.extent % v.step != 0
        if isinstance(e.body, Dot):
            a = self.expr(e.body.lhs, out, inner)
            b = self.expr(e.body.rhs, out, inner)
            if ragged:  # a computed operand is not zero in the last tile's masked lanes (exp(0) = 1)
                a = _zero_past(e.body.lhs, a, v, 1, out, inner)
                b = _zero_past(e.body.rhs, b, v, 0, out, inner)
            a, b = tile_ops.matrix(a, e.body.lhs), tile_ops.matrix(b, e.body.rhs)
            out.append(At(inner, assign(acc, self.dot(e.body, a, b, E(acc)))))
        else:
            x = self.expr(e.body, out, inner)
            if isinstance(e.body, Load | Pull):
                x = to(x, "tl.float32")
            elif ragged:
                axes = {d for x in walk(e.body) if isinstance(x, Load | Pull)
                        for d, tv in enumerate((x.access if isinstance(x, Load) else x.read).tile) if tv == v.name}
                for d in sorted(axes):
                    x = _zero_past(e.body, x, v, d, out, inner)
            out.append(At(inner, K.AugAssign(K.Name(acc), "+", x)))
        out += steps
        self.loop_vars.discard(v.name)
        return E(acc)

    def walk_pointer(self, a, v: Var, out: list, indent: str) -> At:
        """Pointers to access a's tile at reduction var v = 0, set up before v's loop (self.ptrs, what load reads),
        and the step that advances them at the end of each iteration."""
        off, _ = self.offsets(a, masks=False, at_zero=v.name)
        pname = self.tmp(f"{a.tensor.lower()}_ptrs")
        out.append(At(indent, assign(pname, add(self.param(a.tensor), off))))
        self.ptrs[a] = pname
        shape = tensor(self.g, a.tensor).shape
        inc = sum(k * v.step * st for aff, st in zip(a.index, row_major_strides(shape), strict=True)
                  for var, k in aff.terms if var == v.name)
        return At(indent + "    ", K.AugAssign(K.Name(pname), "+", E(inc)))

    def sums_in_one_loop(self, e: Op, out: list, indent: str) -> None:
        """GEMM sums of one expression over the same reduction (SwiGLU's `silu(sum k: x @ W1) * (sum k: x @ W3)`):
        one loop with an accumulator each, an operand tile they share loaded once per step, instead of a loop per
        sum reading that tile again. Their values wait in self.fused_sums for expr."""
        groups: dict[tuple, list[Sum]] = {}
        for s in _sibling_sums(e):
            v = s.var
            if id(s) not in self.fused_sums and _plain_gemm(s):
                groups.setdefault((v.name, v.extent, v.step), []).append(s)
        for group in groups.values():
            if len(group) < 2:
                continue
            v = group[0].var
            accs = [self.tmp("acc") for _ in group]
            for s, acc in zip(group, accs, strict=True):
                out.append(At(indent, assign(acc, call("tl.zeros", tup(*s.shape), dtype="tl.float32"))))
            self.scope[v.name] = v
            inner = indent + "    "
            out.append(At(indent, assign(f"{v.name}_r", call("tl.arange", 0, v.step), f"{v.name} = 0")))
            reads = dict.fromkeys(x.access for s in group for x in (s.body.lhs, s.body.rhs))  # each access once
            steps = [self.walk_pointer(a, v, out, indent) for a in reads]
            self.loop_vars.add(v.name)
            out.append(At(indent, K.For(v.name, E(0), E(v.extent), E(v.step), ())))
            self.bind_tile(v, out, inner)
            tiles: dict = {}  # access -> its tile this step, loaded once for every sum that reads it
            for s, acc in zip(group, accs, strict=True):
                for x in (s.body.lhs, s.body.rhs):
                    if x.access not in tiles:
                        tiles[x.access] = self.expr(x, out, inner)
                a = tile_ops.matrix(tiles[s.body.lhs.access], s.body.lhs)
                b = tile_ops.matrix(tiles[s.body.rhs.access], s.body.rhs)
                out.append(At(inner, assign(acc, self.dot(s.body, a, b, E(acc)))))
            out += steps
            self.loop_vars.discard(v.name)
            self.fused_sums.update({id(s): E(acc) for s, acc in zip(group, accs, strict=True)})


def _sibling_sums(e) -> list[Sum]:
    """The sums of an expression reached through element-wise operations only (not inside another sum)."""
    if isinstance(e, Sum):
        return [e]
    if isinstance(e, Op):
        return [s for a in e.args for s in _sibling_sums(a)]
    return []


def _plain_gemm(s: Sum) -> bool:
    """A sum of a product of two local tiles read straight from memory along its (tile, not rank) reduction, whole
    steps only: the form sums_in_one_loop walks by pointers."""
    v = s.var
    if v.is_rank or v.extent % v.step or not isinstance(s.body, Dot):
        return False
    return all(isinstance(x, Load) and not isinstance(x, Pull) and not x.access.remote
               and not isinstance(x.access, Gathered) and v.name in x.access.vars for x in (s.body.lhs, s.body.rhs))


def _zero_past(e, x: K.Expr, v: Var, axis: int, out: list, indent: str) -> K.Expr:
    """Tile value x (of expression e) with the lanes past the end of ragged loop v along `axis` set to zero, so the
    last tile's masked lanes add nothing to a sum; a load is zero there already."""
    if isinstance(e, Load | Pull) or len(e.shape) <= axis or e.shape[axis] != v.step:
        return x
    cond = cmp(f"{v.name}_r", "<", v.extent)
    if len(e.shape) > 1:
        cond = bcast(cond, axis, len(e.shape))
    out.append(At(indent, K.Assign(x, call("tl.where", cond, x, 0.0))))
    return x


def _direct_loads(e) -> list[Load | Pull]:
    """Loads (and pulls) of an expression that are not inside a nested reduction."""
    if isinstance(e, Load | Pull):
        return [e]
    if isinstance(e, Op):
        return [x for a in e.args for x in _direct_loads(a)]
    if isinstance(e, Dot):
        return _direct_loads(e.lhs) + _direct_loads(e.rhs)
    return []
