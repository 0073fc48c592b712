"""Emitting tile math: expressions, GEMMs (tl.dot), reductions (sums over tiles and ranks), attend and lse_merge."""

from __future__ import annotations

from tilec.errors import TilecError
from tilec.ir.builtins import TILE_FNS
from tilec.ir.dtypes import TL_DTYPE
from tilec.ir.graph import InPlace, Pull, tensor
from tilec.ir.tiling import invert
from tilec.ir.types import ME, Const, Dot, Idx, Load, Op, Sum, TupleCall, Var, logical_shape, walk

from .copies import tile_name
from .model import UNARY
from .text import row_major_strides

_OP_NAMES = {"+": "add", "-": "sub", "*": "mul", "/": "div"}


def op_name(e: Op) -> str:
    """What an operation's result is called: `exp_tile`, `sub_val` (a scalar), `cast_tile`."""
    op = "cast" if e.op.startswith("cast_") else _OP_NAMES.get(e.op, e.op)
    return f"{op}_{'tile' if any(n > 1 for n in e.shape) else 'val'}"


class Compute:
    """Mixin of _Emitter (emit.py): the value of a tile expression, as lines that compute it."""

    def local_pull(self, e) -> bool:
        """A pull from this rank's own memory whose copy solves no rank (one rank: local-in-place removed the copy):
        its pointers walk along a reduction as a load's do."""
        if not isinstance(e, Pull) or isinstance(e, InPlace) or e.source.rank != ME or e.read.rank != ME:
            return False
        world = self.g.graph["program"].world
        loops = {x.name: x for x in e.producer} | {ME: Var(ME, "me", world, 1, e.loc)}
        return all(d.rank_var is None for d in invert(e.write, loops, set(), world, "pull"))

    def in_place_steps(self, e: Pull, v: Var) -> tuple[int, int] | None:
        """How far an in-place read's source and buffer pointers move per step of reduction var v, or None when
        they do not move by a constant (v solves a rank, or the copy's tiles leave gaps along v)."""
        world = self.g.graph["program"].world
        dims = invert(e.write, {x.name: x for x in e.producer} | {ME: Var(ME, "me", world, 1, e.loc)}, set(), world,
                      "in place")
        src_st = row_major_strides(tensor(self.g, e.source.tensor).shape)
        buf = next(t for t in self.g.graph["program"].tensors if t.name == e.read.tensor)  # a pull's is gone
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

    def expr(self, e, out: list[str], indent: str) -> str:
        if isinstance(e, Const):
            lit = repr(int(e.value)) if e.dtype == "i32" else repr(float(e.value))
            if any(s.value is e for s in self.st.body):  # stored as is: broadcast needs a tensor, not a literal
                name = self.tmp("const_val")
                out.append(f"{indent}{name} = tl.full((), {lit}, {TL_DTYPE[e.dtype]})")
                return name
            return lit
        if isinstance(e, Idx):
            return f"({self.scalar(e.index.terms, e.index.const)})"
        if isinstance(e, TupleCall):
            return self.tuple_call(e, out, indent)
        if isinstance(e, Load):
            return self.load(e, out, indent)
        if isinstance(e, Pull) and id(e) in self.walked:
            ptrs, mask, _own = self.walked[id(e)]
            name = self.tmp(tile_name(e.read.tensor if isinstance(e, InPlace) else e.source.tensor, e.shape))
            out.append(f"{indent}{name} = tl.load({ptrs}{f', mask={mask}, other=0' if mask else ''})")
            return name
        if isinstance(e, Pull):
            return self.pull(e, out, indent)
        if isinstance(e, Op):
            args = [self.expr(a, out, indent) for a in e.args]
            if e.dtype == "f32":  # tile math is f32; integer scalars (lengths, offsets) stay integers
                args = [f"{a}.to(tl.float32)" if isinstance(x, Load | Pull) else a
                        for a, x in zip(args, e.args, strict=True)]
            if e.op in "+-*/":
                r = f"({args[0]} {e.op} {args[1]})"
            elif e.op in ("max", "min"):
                r = f"tl.{e.op}imum({args[0]}, {args[1]})"
            elif e.op.startswith("cast_"):  # a literal has no .to(): make it a scalar tensor first
                src = f"tl.full((), {args[0]}, tl.float32)" if isinstance(e.args[0], Const) else args[0]
                r = f"{src}.to({TL_DTYPE[e.dtype]})"
            else:
                r = UNARY[e.op].format(args[0])
            name = self.tmp(op_name(e))
            out.append(f"{indent}{name} = {r}")
            return name
        if isinstance(e, Dot):
            a, b = self.expr(e.lhs, out, indent), self.expr(e.rhs, out, indent)
            name = self.tmp("prod")
            out.append(f"{indent}{name} = {self.dot(e, a, b, None)}")
            return name
        if isinstance(e, Sum):
            return self.sum(e, out, indent)
        raise TilecError(f"codegen: unsupported expression {type(e).__name__}")

    def tuple_call(self, e: TupleCall, out: list[str], indent: str) -> str:
        """A tile-library function (tilec.ir.builtins): its device call on canonical shapes, once per task; an attend
        over a long key tile read from memory is streamed instead."""
        if id(e) in self.memo:
            return self.memo[id(e)]
        if e.fn == "attend" and self._streamable(e):
            self.memo[id(e)] = self.attend_streamed(e, out, indent)
            return self.memo[id(e)]
        args = [self.expr(a, out, indent) for a in e.args]
        o, lse = self.tmp("o"), self.tmp("lse")
        out.append(f"{indent}{TILE_FNS[e.fn].emit(self, e, args, (o, lse))}")
        self.memo[id(e)] = (o, lse)
        return self.memo[id(e)]

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

    def attend_streamed(self, e: TupleCall, out: list[str], indent: str) -> tuple[str, str]:
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
            out.append(f"{indent}{clamped} = {self.key_count(k, n)}")
            n = clamped
        scale = 1.0 / (self.extent_of_last(k) ** 0.5)
        qp, mx, den, acc = self.tmp("q_pad"), self.tmp("row_max"), self.tmp("den"), self.tmp("acc")
        out.append(f"{indent}{qp}, {mx}, {den}, {acc} = td.attend_init(tl.reshape({q}, ({mq}, {qs[-1]})))")
        c = self.tmp("kb")
        blk = self.attend_block
        # a one-trip tile shorter than its step stops at its extent: the blocks past it are padding
        span = -(-pos.extent // blk) * blk if pos.extent < pos.step else pos.step
        out.append(f"{indent}for {c} in range(0, {span}, {blk}):  # blocks of keys")
        inner = indent + "    "
        rng = f"{c}_r"
        out.append(f"{inner}{rng} = {pos.name} + {c} + tl.arange(0, {blk})")
        tiles = []
        for x in (k, v):
            a = x.access
            for w in self.waits.pop(a, []):
                self.wait(w, out, indent)
            # a [keys, D] block (pos is the first tile dim: _streamable) with no unit axes: reshaping a
            # [1, 1, keys, D] load before the dot cost the H200 10-15% of its streaming rate once v fed the dot
            # straight from shared memory
            off, mask = self.offsets(a, ranges={pos.name: rng}, squeeze=True)
            live = f"({c} + tl.arange(0, {blk}) < {n})[:, None]"
            mask = f"{mask} & {live}" if mask else live
            name = self.tmp(tile_name(a.tensor, (blk,)))
            out.append(f"{inner}{name} = tl.load({self.param(a.tensor)} + {off}, mask={mask}, other=0)")
            tiles.append(name)
        out.append(f"{inner}{mx}, {den}, {acc} = td.attend_step({qp}, {tiles[0]}, {tiles[1]}, {n} - {c}, {mx},"
                   f" {den}, {acc}, {scale!r}, INTERPRET, True)")  # loads masked past n: rows are 0
        o, lse = self.tmp("o"), self.tmp("lse")
        out.append(f"{indent}{o}, {lse} = td.attend_finish({mx}, {den}, {acc}, {mq})")
        return o, lse

    def extent_of_last(self, x) -> int:
        """The true (unpadded) extent of a load's last tile dim (e.g. the head dim D)."""
        tv = [t for t in x.access.tile if t][-1]
        return self.scope[tv].extent

    def key_count(self, k, n: str) -> str:
        """attend's count n of valid keys, clamped to the real rows of a padded key tile k (its masked rows load as
        zeros, which are not keys)."""
        rows = self.rows_valid(k)
        return n if rows is None else f"tl.minimum({n}, {rows})"

    def rows_valid(self, x) -> int | str | None:
        """How many rows of a load's first tile dim are real, where the tile is padded: the extent of a one-trip
        tile var shorter than its step (`p in 40 by 64`), `min(step, extent - start)` of a ragged multi-trip one;
        None where every row is. Row-wise reductions (attend's keys, lse_merge's partials) must skip the padding:
        masked loads give 0 there, which is a real key or partial to them."""
        v = self.scope[[t for t in x.access.tile if t][0]]
        if v.extent % v.step == 0:
            return None
        if v.extent < v.step:
            return v.extent
        return f"tl.minimum({v.extent} - {v.name}, {v.step})"

    def dot(self, e: Dot, a: str, b: str, acc: str | None) -> str:
        ieee = e.lhs.dtype == "f32"
        args = f"{a}, {b}" + (f", {acc}" if acc else "")
        return f"td.dot({args}, INTERPRET, {ieee})" if acc else f"td.dot({a}, {b}, None, INTERPRET, {ieee})"

    def sum(self, e: Sum, out: list[str], indent: str) -> str:
        acc = self.tmp("acc")
        shape = ", ".join(map(str, e.shape)) or "1"
        out.append(f"{indent}{acc} = tl.zeros(({shape},), dtype=tl.float32)" if len(e.shape) == 1 else
                   f"{indent}{acc} = tl.zeros(({shape}), dtype=tl.float32)")
        v = e.var
        self.scope[v.name] = v
        inner = indent + "    "
        steps: list[str] = []
        if not v.is_rank:
            # local tiles walked along the reduction: pointers set up once, then advanced (as hand-written GEMMs do)
            walked = [x for x in _direct_loads(e.body) if isinstance(x, Load) and not x.access.remote
                      and v.name in x.access.vars]
            in_place = [(x, inc) for x in _direct_loads(e.body) if isinstance(x, InPlace) or self.local_pull(x)
                        for inc in [self.in_place_steps(x, v)] if inc]
            if walked or in_place:
                out.append(f"{indent}{v.name}_r = tl.arange(0, {v.step})  # {v.name} = 0")
            for x, (inc_src, inc_buf) in in_place:  # this rank's rows or a peer's: one pointer walks either
                ptrs, mask, own = self.pull(x, out, indent, walk=v.name)
                self.walked[id(x)] = (ptrs, mask, own)
                inc = str(inc_src) if inc_src == inc_buf or own is None else f"tl.where({own}, {inc_src}, {inc_buf})"
                steps.append(f"{inner}{ptrs} += {inc}")
            for x in walked:
                off, _ = self.offsets(x.access, masks=False, at_zero=v.name)
                pname = self.tmp(f"{x.access.tensor.lower()}_ptrs")
                out.append(f"{indent}{pname} = {self.param(x.access.tensor)} + {off}")
                self.ptrs[x.access] = pname
                t = tensor(self.g, x.access.tensor)
                inc = sum(k * v.step * st for aff, st in zip(x.access.index, row_major_strides(t.shape), strict=True)
                          for var, k in aff.terms if var == v.name)
                steps.append(f"{inner}{pname} += {inc}")
        self.loop_vars.add(v.name)
        if v.is_rank:
            out.append(f"{indent}for {v.name} in range(0, {self.world}):")
        else:
            out.append(f"{indent}for {v.name} in range(0, {v.extent}, {v.step}):")
            self.bind_tile(v, out, inner)
        ragged = not v.is_rank and v.extent % v.step != 0
        if isinstance(e.body, Dot):
            a = self.expr(e.body.lhs, out, inner)
            b = self.expr(e.body.rhs, out, inner)
            if ragged:  # a computed operand is not zero in the last tile's masked lanes (exp(0) = 1)
                a = _zero_past(e.body.lhs, a, v, 1, out, inner)
                b = _zero_past(e.body.rhs, b, v, 0, out, inner)
            out.append(f"{inner}{acc} = {self.dot(e.body, a, b, acc)}")
        else:
            x = self.expr(e.body, out, inner)
            if isinstance(e.body, Load | Pull):
                x = f"{x}.to(tl.float32)"
            elif ragged:
                axes = {d for x in walk(e.body) if isinstance(x, Load | Pull)
                        for d, tv in enumerate((x.access if isinstance(x, Load) else x.read).tile) if tv == v.name}
                for d in sorted(axes):
                    x = _zero_past(e.body, x, v, d, out, inner)
            out.append(f"{inner}{acc} += {x}")
        out += steps
        self.loop_vars.discard(v.name)
        return acc


def _zero_past(e, x: str, v: Var, axis: int, out: list[str], indent: str) -> str:
    """Tile value x (of expression e) with the lanes past the end of ragged loop v along `axis` set to zero, so the
    last tile's masked lanes add nothing to a sum; a load is zero there already."""
    if isinstance(e, Load | Pull) or len(e.shape) <= axis or e.shape[axis] != v.step:
        return x
    sel = ", ".join(":" if d == axis else "None" for d in range(len(e.shape)))
    cond = f"({v.name}_r < {v.extent})" + (f"[{sel}]" if len(e.shape) > 1 else "")
    out.append(f"{indent}{x} = tl.where({cond}, {x}, 0.0)")
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
