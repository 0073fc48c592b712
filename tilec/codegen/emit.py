"""The render-model pass: the final graph -> a ModuleModel of plain strings that the jinja2 templates only print.

Each kernel is a persistent loop over the tasks of its stages (`for task in range(pid, TOTAL, NPROG)`); each task
decodes its loop variables, waits for the producer tiles it reads, computes, stores, and releases its flags.
Dims are compile-time constants, so masks are emitted only where a tile really overhangs its loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from tilec.errors import TilecError
from tilec.ir.graph import Flag, Kernel, Pull, flags, stage, stages, tensor, waits
from tilec.ir.queries import flag_dims
from tilec.ir.tiling import DimInverse, invert, strides
from tilec.ir.types import ME, Access, Const, Dot, Idx, Load, Op, Sum, TupleCall, Var, logical_shape
from tilec.ir.wait_plan import plan_wait

TL_DTYPE = {"f16": "tl.float16", "bf16": "tl.bfloat16", "f32": "tl.float32", "i32": "tl.int32"}
UNARY = {
    "exp": "tl.exp({})", "log": "tl.log({})", "sqrt": "tl.sqrt({})", "abs": "tl.abs({})",
    "relu": "tl.maximum({}, 0.0)", "sigmoid": "tl.sigmoid({})", "silu": "({0} * tl.sigmoid({0}))",
    "tanh": "(2.0 * tl.sigmoid(2.0 * {}) - 1.0)", "neg": "(-{})",
}


@dataclass(frozen=True)
class TaskFn:
    """One stage's task body as a device function (merged kernels call one per stage, so each stage's names
    stay its own: Triton wants a name bound in both branches of an `if` to keep one type)."""

    name: str
    lines: tuple[str, ...]


@dataclass(frozen=True)
class KernelModel:
    name: str
    stages: tuple[str, ...]
    params: tuple[str, ...]  # pointer parameters, in order
    lines: tuple[str, ...]  # body of the persistent loop, indented relative to it
    total: int
    persistent: bool
    concurrent: bool
    barrier_before: bool
    share: float  # fraction of the co-resident programs this kernel takes when launched concurrently
    groups: int  # > 0: workgroup-specialized, one program group per stage (the body holds its own loops)
    tasks: tuple[TaskFn, ...] = ()


@dataclass(frozen=True)
class FlagModel:
    name: str
    param: str
    size: int
    count: int
    producer: str
    key: str
    number: int


@dataclass(frozen=True)
class TensorModel:
    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    symmetric: bool


@dataclass(frozen=True)
class ModuleModel:
    header: tuple[str, ...]
    program: str
    world: int
    schedule: str
    tensors: tuple[TensorModel, ...]
    flags: tuple[FlagModel, ...]
    kernels: tuple[KernelModel, ...]
    num_warps: int
    num_stages: int
    exit_barrier: bool
    library: tuple[str, ...]  # tile-library device functions used (attend, lse_merge)
    timeline_slots: int = 0  # > 0: a timeline build, one record per task of every kernel
    noinline_tasks: bool = False  # merged kernels call their stages' task functions instead of inlining them


class _Emitter:
    """Emits the lines of one task of one stage."""

    def __init__(self, g: nx.DiGraph, st, flag_no: dict[str, int], flag_scope: dict[str, str],
                 attend_block: int = 64):
        self.g, self.st = g, st
        self.attend_block = attend_block  # keys per block of a streamed attend
        self.world = g.graph["program"].world
        self.lines: list[str] = []
        self.prologue: list[str] = []  # per-task setup (peer offsets, hoisted index math)
        self.peers: dict[str, str] = {}  # peer-offset call -> its name in the prologue (per peer and element size)
        self.wait_lines: list[str] = []  # the task's flag waits, first thing after decoding its tile
        self.waited: set[tuple] = set()  # what the waits emitted so far cover (see wait)
        self.n = 0
        self.flag_no = flag_no
        self.scope: dict[str, Var] = {v.name: v for v in st.loops} | {ME: Var(ME, "me", self.world, 1, st.loc)}
        self.loop_vars: set[str] = set()  # reduction vars bound by an enclosing emitted loop
        self.waits: dict[Access, list] = {}
        for w in waits(g, st.name):
            self.waits.setdefault(w.read, []).append(w)
        self.params: list[str] = []
        self.fl = {f.name: f for f in flags(g)}
        self.flag_scope = flag_scope  # flag -> "gpu" or "sys" (flag_scopes)
        self.ptrs: dict[Access, str] = {}  # access -> pointer walked along an enclosing reduction
        self.memo: dict[int, tuple[str, str]] = {}  # tile-function calls shared by several stores
        self.library: set[str] = set()  # tile-library device functions the task uses

    def tmp(self, prefix: str = "x") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def param(self, name: str) -> str:
        if name not in self.params:
            self.params.append(name)
        return name

    # -- index arithmetic --------------------------------------------------------------------------
    @staticmethod
    def scalar(terms, const: int, names: dict[str, str] | None = None) -> str:
        parts = []
        for v, k in terms:
            v = (names or {}).get(v, v)
            parts.append(v if k == 1 else f"{k} * {v}")
        if const or not parts:
            parts.append(str(const))
        return " + ".join(parts)

    def start(self, aff) -> str:
        return self.scalar(aff.terms, aff.const)

    def mask_of(self, v: Var, r: str | None = None) -> str | None:
        return f"({r or v.name + '_r'} < {v.extent})" if v.extent % v.step else None

    def bind_tile(self, v: Var, out: list[str], indent: str, hint: bool = False) -> None:
        r = f"{v.name} + tl.arange(0, {v.step})"
        if hint:  # tile starts are multiples of the step: lets Triton vectorize and pipeline the loads
            r = f"tl.max_contiguous(tl.multiple_of({r}, {v.step}), {v.step})"
        out.append(f"{indent}{v.name}_r = {r}")

    def offsets(self, a: Access, masks: bool = True, at_zero: str | None = None,
                ranges: dict[str, str] | None = None, squeeze: bool = False) -> tuple[str, str | None]:
        """Pointer offset (broadcast over the tile's dims) and mask for an affine access (`at_zero`: that
        variable taken as 0; `ranges`: a tile variable's index vector under another name, e.g. one block;
        `squeeze`: broadcast over the tile dims only, so one-element dims leave no unit axes in the block)."""
        t = tensor(self.g, a.tensor)
        st = _strides(t.shape)
        axes = [d for d, tv in enumerate(a.tile) if tv] if squeeze else list(range(len(a.index)))
        nd = len(axes)
        offs, mks = [], []
        wide = t.numel >= 2**31
        for d, (aff, tv) in enumerate(zip(a.index, a.tile, strict=True)):
            rest = [(v, k) for v, k in aff.terms if v != tv and v != at_zero]
            base = self.scalar(rest, aff.const)
            if tv:
                r = (ranges or {}).get(tv, f"{tv}_r")
                e = r if base == "0" else f"({base} + {r})"
                e = _bcast(e, axes.index(d), nd)
                m = self.mask_of(self.scope[tv], r)
                if m and masks:
                    mks.append(_bcast(m, axes.index(d), nd))
            else:
                e = f"({base})"
            if wide and d == 0:
                e = f"{e}.to(tl.int64)"
            offs.append(e if st[d] == 1 else f"{e} * {st[d]}")
        off = " + ".join(offs)
        if not any(a.tile):  # every dim is one element: keep the tile's (1, ..., 1) block shape
            off = f"{off} + tl.zeros(({', '.join('1' for _ in a.index)},), dtype=tl.int32)"
        return off, " & ".join(mks) or None

    # -- expressions -----------------------------------------------------------------------------
    def expr(self, e, out: list[str], indent: str) -> str:
        if isinstance(e, Const):
            return repr(int(e.value)) if e.dtype == "i32" else repr(float(e.value))
        if isinstance(e, Idx):
            return f"({self.scalar(e.index.terms, e.index.const)})"
        if isinstance(e, TupleCall):
            return self.tuple_call(e, out, indent)
        if isinstance(e, Load):
            return self.load(e, out, indent)
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
            elif e.op.startswith("cast_"):
                r = f"{args[0]}.to({TL_DTYPE[e.dtype]})"
            else:
                r = UNARY[e.op].format(args[0])
            name = self.tmp()
            out.append(f"{indent}{name} = {r}")
            return name
        if isinstance(e, Dot):
            a, b = self.expr(e.lhs, out, indent), self.expr(e.rhs, out, indent)
            name = self.tmp("acc")
            out.append(f"{indent}{name} = {self.dot(e, a, b, None)}")
            return name
        if isinstance(e, Sum):
            return self.sum(e, out, indent)
        raise TilecError(f"codegen: unsupported expression {type(e).__name__}")

    def tuple_call(self, e: TupleCall, out: list[str], indent: str) -> str:
        """attend / lse_merge: library device functions on canonical 2-d/3-d shapes; evaluated once per task."""
        if id(e) in self.memo:
            return self.memo[id(e)]
        if e.fn == "attend" and self._streamable(e):
            self.memo[id(e)] = self.attend_streamed(e, out, indent)
            self.library.add(e.fn)
            return self.memo[id(e)]
        args = [self.expr(a, out, indent) for a in e.args]
        o, lse = self.tmp("o"), self.tmp("lse")
        if e.fn == "attend":
            q, k, v = (logical_shape(a) for a in e.args[:3])
            mq = q[0] if len(q) == 2 else 1
            scale = 1.0 / (self._extent_of_last(e.args[1]) ** 0.5)
            out.append(f"{indent}{o}, {lse} = _tilec_attend(tl.reshape({args[0]}, ({mq}, {q[-1]})),"
                       f" tl.reshape({args[1]}, {k}), tl.reshape({args[2]}, {v}), {args[3]}, {scale!r}, UPCAST_DOT)")
        else:
            ov, lv = (logical_shape(a) for a in e.args)
            m = 1
            for x in lv[1:]:
                m *= x
            n_valid = self._extent_of_first(e.args[1])
            out.append(f"{indent}{o}, {lse} = _tilec_lse_merge(tl.reshape({args[0]}, ({ov[0]}, {m}, {ov[-1]})),"
                       f" tl.reshape({args[1]}, ({lv[0]}, {m})), {n_valid})")
        self.library.add(e.fn)
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
        scale = 1.0 / (self._extent_of_last(k) ** 0.5)
        qp, mx, den, acc = self.tmp("qp"), self.tmp("m"), self.tmp("den"), self.tmp("acc")
        out.append(f"{indent}{qp}, {mx}, {den}, {acc} = _tilec_attend_init(tl.reshape({q}, ({mq}, {qs[-1]})))")
        c = self.tmp("c")
        blk = self.attend_block
        out.append(f"{indent}for {c} in range(0, {pos.step}, {blk}):  # blocks of keys")
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
            name = self.tmp()
            out.append(f"{inner}{name} = tl.load({self.param(a.tensor)} + {off}, mask={mask}, other=0)")
            tiles.append(name)
        out.append(f"{inner}{mx}, {den}, {acc} = _tilec_attend_step({qp}, {tiles[0]}, {tiles[1]}, {n} - {c}, {mx},"
                   f" {den}, {acc}, {scale!r}, UPCAST_DOT, True)")  # loads masked past n: rows are 0
        o, lse = self.tmp("o"), self.tmp("lse")
        out.append(f"{indent}{o}, {lse} = _tilec_attend_finish({mx}, {den}, {acc}, {mq})")
        return o, lse

    def _extent_of_last(self, x) -> int:
        """The true (unpadded) extent of a load's last tile dim (e.g. the head dim D)."""
        tv = [t for t in x.access.tile if t][-1]
        return self.scope[tv].extent

    def _extent_of_first(self, x) -> int:
        tv = [t for t in x.access.tile if t][0]
        return self.scope[tv].extent

    def dot(self, e: Dot, a: str, b: str, acc: str | None) -> str:
        ieee = e.lhs.dtype == "f32"
        args = f"{a}, {b}" + (f", {acc}" if acc else "")
        return f"_tilec_dot({args}, UPCAST_DOT, {ieee})" if acc else f"_tilec_dot({a}, {b}, None, UPCAST_DOT, {ieee})"

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
            walked = [x for x in _direct_loads(e.body) if not x.access.remote and v.name in x.access.vars]
            if walked:
                out.append(f"{indent}{v.name}_r = tl.arange(0, {v.step})  # {v.name} = 0")
            for x in walked:
                off, _ = self.offsets(x.access, masks=False, at_zero=v.name)
                pname = self.tmp("p")
                out.append(f"{indent}{pname} = {self.param(x.access.tensor)} + {off}")
                self.ptrs[x.access] = pname
                t = tensor(self.g, x.access.tensor)
                inc = sum(k * v.step * st for aff, st in zip(x.access.index, _strides(t.shape), strict=True)
                          for var, k in aff.terms if var == v.name)
                steps.append(f"{inner}{pname} += {inc}")
        self.loop_vars.add(v.name)
        if v.is_rank:
            out.append(f"{indent}for {v.name} in range(0, {self.world}):")
        else:
            out.append(f"{indent}for {v.name} in range(0, {v.extent}, {v.step}):")
            self.bind_tile(v, out, inner)
        if isinstance(e.body, Dot):
            a = self.expr(e.body.lhs, out, inner)
            b = self.expr(e.body.rhs, out, inner)
            out.append(f"{inner}{acc} = {self.dot(e.body, a, b, acc)}")
        else:
            x = self.expr(e.body, out, inner)
            if isinstance(e.body, Load | Pull):
                x = f"{x}.to(tl.float32)"
            out.append(f"{inner}{acc} += {x}")
        out += steps
        self.loop_vars.discard(v.name)
        return acc

    def load(self, e: Load, out: list[str], indent: str) -> str:
        a = e.access
        for w in self.waits.pop(a, []):  # each tile read is waited for once per task
            self.wait(w, out, indent)
        off, mask = self.offsets(a)
        ptr = self.param(a.tensor)
        m = f", mask={mask}, other=0" if mask else ""
        name = self.tmp()
        if a in self.ptrs:
            out.append(f"{indent}{name} = tl.load({self.ptrs[a]}{m})")
        elif a.remote:
            delta = self.peer_offset(a.rank, tensor(self.g, a.tensor).dtype, {a.rank}, out, indent)
            out.append(f"{indent}{name} = tl.load({ptr} + {delta} + {off}{m})")
        else:
            out.append(f"{indent}{name} = tl.load({ptr} + {off}{m})")
        return name

    def peer_offset(self, rank_expr: str, dtype: str, deps: set[str], out: list[str], indent: str) -> str:
        """Element offset to a peer's copy, computed once per task when the peer does not change inside loops."""
        line = f"_tilec_peer_offset(heap_bases, rank, {rank_expr}, {_ESIZE[dtype]})"
        if not deps & self.loop_vars and line in self.peers:
            return self.peers[line]
        name = self.tmp("peer")
        if deps & self.loop_vars:
            out.append(f"{indent}{name} = {line}")
        else:
            self.prologue.append(f"    {name} = {line}")
            self.peers[line] = name
        return name

    def pull(self, e: Pull, body_out: list[str], body_indent: str) -> str:
        """Read the copy's source directly: solve the copy's variables per element of the buffer tile."""
        prog = self.g.graph["program"]
        ploops = {v.name: v for v in e.producer} | {ME: Var(ME, "me", prog.world, 1, e.loc)}
        dims = invert(e.write, ploops, set(), prog.world, "fused-pull")
        nd = len(e.read.index)
        vals: dict[str, str] = {}
        scalar_ranks: dict[str, set[str]] = {}  # rank values that are one scalar per tile -> vars they depend on
        masks = []
        for d, (inv, aff, tv) in enumerate(zip(dims, e.read.index, e.read.tile, strict=True)):
            span = e.read.shape[d]
            start = self.start(aff)
            cm = self.mask_of(self.scope[tv]) if tv else None
            if cm:
                masks.append(_bcast(cm, d, nd))
            uniform = all(x % span == 0 for x in (aff.const - inv.const, inv.extent)) and \
                (not inv.rank_var or inv.rank_coef % span == 0) and \
                all(k % span == 0 for v, k in aff.terms if v != tv)
            x = self.tmp("e")
            # per-tile setup goes to the task prologue unless it moves with an enclosing reduction
            hoist = not (set(aff.vars) & self.loop_vars)
            out, indent = (self.prologue, "    ") if hoist else (body_out, body_indent)
            if uniform or not tv:
                out.append(f"{indent}{x} = {start} - {inv.const}")
                if inv.rank_var:
                    out.append(f"{indent}{x}_rk = {x} // {inv.rank_coef}")
                    out.append(f"{indent}{x} = {x} - {inv.rank_coef} * {x}_rk")
                    vals[inv.rank_var] = f"{x}_rk"
                    scalar_ranks[f"{x}_rk"] = set(aff.vars)
                if tv:
                    out.append(f"{indent}{x} = {x} + tl.arange(0, {span})")
            else:
                out.append(f"{indent}{x} = {start} + tl.arange(0, {span}) - {inv.const}")
                if inv.rank_var:
                    out.append(f"{indent}{x}_rk = {x} // {inv.rank_coef}")
                    out.append(f"{indent}{x} = {x} - {inv.rank_coef} * {x}_rk")
                    vals[inv.rank_var] = _bcast(f"{x}_rk", d, nd)
            if inv.tile_var:
                vals[inv.tile_var] = _bcast(x, d, nd) if tv else x
                if inv.extent % span or not uniform:
                    masks.append(_bcast(f"({x} < {inv.extent})", d, nd) if tv else f"({x} < {inv.extent})")
        out, indent = body_out, body_indent
        t = tensor(self.g, e.source.tensor)
        st = _strides(t.shape)
        # the copy ran on the rank that holds the buffer read here: `rank` in the copy is that rank
        me_val = vals.get(ME, "rank" if e.read.rank == ME else e.read.rank)
        offs = []
        for j, aff in enumerate(e.source.index):
            # a copy loop the buffer index does not solve has one trip (the verifier rejects the rest): it is 0
            terms = [(me_val if v == ME else vals.get(v, "0"), k) for v, k in aff.terms]
            ex = self.scalar(terms, aff.const)
            if t.numel >= 2**31 and j == 0:
                ex = f"({ex}).to(tl.int64)"
            offs.append(f"({ex})" if st[j] == 1 else f"({ex}) * {st[j]}")
        ptr = self.param(e.source.tensor)
        m = f", mask={' & '.join(masks)}, other=0" if masks else ""
        name = self.tmp()
        if e.source.rank == ME:
            src_rank = None if me_val == "rank" else me_val
            if src_rank is not None and src_rank not in scalar_ranks:
                scalar_ranks[src_rank] = {e.read.rank}
        else:
            src_rank = vals.get(e.source.rank, "rank")
        if src_rank is None:
            out.append(f"{indent}{name} = tl.load({ptr} + {' + '.join(offs)}{m})")
        elif src_rank in scalar_ranks:
            delta = self.peer_offset(src_rank, t.dtype, scalar_ranks[src_rank], out, indent)
            out.append(f"{indent}{name} = tl.load({ptr} + {delta} + {' + '.join(offs)}{m})")
        else:  # the tile straddles ranks: iris translates each row's address to its own peer
            out.append(f"{indent}{name} = iris.load({ptr} + {' + '.join(offs)}, rank, {src_rank}, heap_bases{m})")
        return name

    # -- flags -----------------------------------------------------------------------------------
    def wait(self, w, out: list[str], indent: str) -> None:
        f: Flag = self.fl[w.flag]
        read = w.read
        # Waits go at the start of the task and cover everything its reductions will read, so the reduction
        # loop stays free of spins (Triton pipelines its loads only then).
        plan = plan_wait(self.g, f, read, self.loop_vars, self.scope, self.flag_scope[f.name])
        if plan.key in self.waited:  # an earlier wait of this task covers these counters
            return
        self.waited.add(plan.key)
        target_lines, ind = self.wait_lines, "    "
        fp = self.param(f"F_{_ident(f.name)}")
        owner = plan.owner
        target_lines.append(f"{ind}# wait until stage {f.producer} has written the tiles of {read} this call")
        if owner in self.loop_vars:  # read on every rank of a `sum r in ranks`: wait on each owner up front
            target_lines.append(f"{ind}for {owner} in range(0, {self.world}):")
            ind += "    "
        spans = []  # per keyed dim: its first and last counter
        for r in plan.reach:
            lo = self.tmp("lo")
            target_lines.append(f"{ind}{lo} = {self.scalar(list(r.terms), r.const)}")
            last = self.tmp("fb")
            target_lines.append(f"{ind}{last} = {_lin(r.dim, f'({lo} + {r.top})')}")
            spans.append((_lin(r.dim, lo), last))
        idx_parts, mask = [], None
        for i, (r, (first, last)) in enumerate(zip(plan.reach, spans, strict=True)):
            fvar = self.tmp("f")
            if i == plan.block_dim:  # one block of atomics per poll; the chunk loop nearly always runs once
                target_lines.append(f"{ind}for {fvar} in range({first}, {last} + 1, {plan.block}):")
                ind += "    "
                target_lines.append(f"{ind}{fvar}_v = {fvar} + tl.arange(0, {plan.block})")
                mask = f"{fvar}_v <= {last}"
                fvar = f"{fvar}_v"
            else:
                target_lines.append(f"{ind}for {fvar} in range({first}, {last} + 1):")
                ind += "    "
            idx_parts.append(fvar if r.stride == 1 else f"{fvar} * {r.stride}")
        idx = " + ".join(idx_parts) or "0"
        tail = f"\"{self.flag_scope[f.name]}\", UPCAST_DOT)"
        if mask is None:
            target_lines.append(f"{ind}_tilec_wait({fp} + {idx}, epoch * {f.count}, rank, {owner}, heap_bases, ERR,"
                                f" max_spin, {self.flag_no[f.name]}, {idx}, {tail}")
        else:
            target_lines.append(f"{ind}_tilec_wait_all({fp}, {idx}, {mask}, epoch * {f.count}, rank, {owner},"
                                f" heap_bases, ERR, max_spin, {self.flag_no[f.name]}, {tail}")

    def release(self, f: Flag, out: list[str], indent: str) -> None:
        dims = flag_dims(self.g, f)
        st = strides(dims)
        parts = []
        for d, s in zip(dims, st, strict=True):
            if d.size == 1:
                continue
            r = d.rank_var if d.key_rank else "0"
            t = f"({d.tile_var} // {d.step})" if d.key_tile else "0"
            lin = _lin_of(d, r, t)
            parts.append(lin if s == 1 else f"({lin}) * {s}")
        idx = " + ".join(parts) or "0"
        fp = self.param(f"F_{_ident(f.name)}")
        owner = "rank" if f.write.rank == ME else f.write.rank
        out.append(f"{indent}_tilec_release({fp} + {idx}, rank, {owner}, heap_bases, \"{self.flag_scope[f.name]}\")")

    # -- one task ----------------------------------------------------------------------------------
    def task(self, task_var: str, group_m: int, timeline: tuple[int, int] | None = None) -> list[str]:
        """The task's lines. timeline=(first slot, stage number): record when the task started, when its waits
        were done and when it finished (a debug build for `tilec taxes --timeline`)."""
        st = self.st
        head = [f"    # stage {st.name} over " + ", ".join(
            f"{v.name} in ranks" if v.is_rank else f"{v.name} in {v.extent} by {v.step}" for v in st.loops)]
        head += self.decode(task_var, group_m)
        body: list[str] = []
        for s in st.body:
            val = self.expr(s.value, body, "    ")
            a = s.access
            off, mask = self.offsets(a)
            ptr = self.param(a.tensor)
            dt = TL_DTYPE[tensor(self.g, a.tensor).dtype]
            m = f", mask={mask}" if mask else ""
            shape = ", ".join(map(str, a.shape))
            shape = f"({shape},)" if len(a.shape) == 1 else f"({shape})"
            if s.part is not None:  # one result of a tile function, laid out as the target tile
                val = val[s.part]
                rshape = s.value.outs[s.part][1]
                if not rshape:
                    v = f"(tl.zeros({shape}, dtype=tl.float32) + tl.max(tl.reshape({val}, (1,)), axis=0))"
                else:
                    v = f"tl.reshape({val}, {shape})"
            elif isinstance(s.value, Const | Op | Idx) and s.value.shape != a.shape and \
                    len(s.value.shape) in (0, len(a.shape)):
                v = f"tl.broadcast_to({val}, {shape})"
            elif s.value.shape != a.shape:  # same tile up to unit dims, e.g. a [BM, BN] sum into P[r, m, n]
                v = f"tl.reshape({val}, {shape})"
            else:
                v = val
            if a.remote:  # one peer per task: offset the local addresses once (iris.store translates every element's
                # address: a 128x64 copy tile took 16.4 us, 1.6 us with the offset, on the H200)
                delta = self.peer_offset(a.rank, tensor(self.g, a.tensor).dtype, {a.rank}, body, "    ")
                body.append(f"    tl.store({ptr} + {delta} + {off}, {v}.to({dt}){m})")
            else:
                body.append(f"    tl.store({ptr} + {off}, {v}.to({dt}){m})")
        for f in flags(self.g):
            if f.producer == st.name:
                self.release(f, body, "    ")
        if timeline is None:
            return head + self.wait_lines + self.prologue + body
        slot, number = timeline
        tp = self.param("TIMELINE")
        return [*head, "    _tl_start = _tilec_clock(UPCAST_DOT)", *self.wait_lines,
                "    _tl_waited = _tilec_clock(UPCAST_DOT)", *self.prologue, *body,
                f"    _tilec_mark({tp} + ({slot} + {task_var}) * 5, {number}, _tl_start, _tl_waited, UPCAST_DOT)"]

    def decode(self, task_var: str, group_m: int) -> list[str]:
        loops = list(self.st.loops)
        out = []
        tiles = [v for v in loops if not v.is_rank]
        grouped = group_m > 1 and len(loops) >= 2 and all(not v.is_rank and v.trips > 1 for v in loops[-2:])
        if grouped:  # the last two loops are the output tile's rows and columns; outer loops (e.g. ranks) wrap them
            m, n = loops[-2:]
            tv = task_var if len(loops) == 2 else f"{task_var}_mn"
            if tv != task_var:
                out.append(f"    {tv} = {task_var} % {m.trips * n.trips}")
            out += [
                f"    # grouped order: {group_m} rows of {m.name}-tiles share the {n.name}-tiles in L2",
                f"    g_size = {group_m} * {n.trips}",
                f"    g_first = ({tv} // g_size) * {group_m}",
                f"    g_rows = tl.minimum({m.trips} - g_first, {group_m})",
                f"    {m.name} = (g_first + ({tv} % g_size) % g_rows) * {m.step}",
                f"    {n.name} = (({tv} % g_size) // g_rows) * {n.step}",
            ]
        outer = loops[:-2] if grouped else loops
        if outer:
            rest = task_var if not grouped else f"({task_var} // {m.trips * n.trips})"
            multi = [v for v in outer if v.trips > 1]
            for v in outer:
                if v.trips == 1:  # one-trip loops (and `:` slices) start at 0
                    out.append(f"    {v.name} = 0")
            for i, v in enumerate(reversed(multi)):
                last = i == len(multi) - 1
                val = rest if last else f"{rest} % {v.trips}"
                out.append(f"    {v.name} = {val}" if v.step == 1 else f"    {v.name} = ({val}) * {v.step}")
                if not last:
                    out.append(f"    {task_var}_{i} = {rest} // {v.trips}")
                    rest = f"{task_var}_{i}"
        for v in tiles:
            if v.step > 1 or v.name.startswith("_"):  # unit-step loops index like scalars (`:` slices do not)
                self.bind_tile(v, out, "    ", hint=v.step > 1)
        return out


_ESIZE = {"f16": 2, "bf16": 2, "f32": 4, "i32": 4}


def flag_scopes(g: nx.DiGraph) -> dict[str, str]:
    """Memory scope of each flag's release and acquires: "gpu" when every release and every wait is on the
    rank's own counter (producer and consumer share the GPU), else "sys" (a peer GPU writes or reads it, over
    NVLink: only a system-scope release orders the data before the counter there)."""
    local = {f.name for f in flags(g) if f.write.rank == ME}
    for s in stages(g):
        for w in waits(g, s.name):
            if w.read.rank != ME:
                local.discard(w.flag)
    return {f.name: "gpu" if f.name in local else "sys" for f in flags(g)}


def _direct_loads(e) -> list[Load]:
    """Loads of an expression that are not inside a nested reduction."""
    if isinstance(e, Load):
        return [e]
    if isinstance(e, Op):
        return [x for a in e.args for x in _direct_loads(a)]
    if isinstance(e, Dot):
        return _direct_loads(e.lhs) + _direct_loads(e.rhs)
    return []


def _lin(d: DimInverse, e: str) -> str:
    x = f"({e} - {d.const})" if d.const else e
    if d.rank_var:
        r = f"({x} // {d.rank_coef})"
        off = f"({x} - {d.rank_coef} * {r})"
    else:
        r, off = "0", x
    t = f"({off} // {d.step})" if d.tile_var and d.key_tile else "0"
    return _lin_of(d, r if d.key_rank else "0", t)


def _lin_of(d: DimInverse, r: str, t: str) -> str:
    parts = []
    if d.key_rank:
        parts.append(f"{r} * {d.trips}" if d.key_tile and d.trips != 1 else r)
    if d.key_tile:
        parts.append(t)
    return " + ".join(parts) or "0"


def _ident(s: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in s)


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= n
    return out[::-1]


def _bcast(e: str, d: int, nd: int) -> str:
    if nd == 1:
        return e
    idx = ", ".join(":" if i == d else "None" for i in range(nd))
    return f"{e}[{idx}]"


def build_model(g: nx.DiGraph, schedule: str, options: dict) -> ModuleModel:
    prog = g.graph["program"]
    flag_no = {f.name: i + 1 for i, f in enumerate(flags(g))}
    scopes = flag_scopes(g)
    kernels = []
    nconc = sum(1 for k in g.graph["kernels"] if k.concurrent) or 1
    slots = 0 if options.get("timeline") else None
    for k in g.graph["kernels"]:
        kernels.append(_kernel(g, k, flag_no, scopes, options.get("group_m", 8),
                               1.0 / nconc if k.concurrent else 1.0,
                               options.get("start_local", False), slots, options.get("attend_block", 64)))
        if slots is not None:
            slots += kernels[-1].total
    tensors_used = []
    for _, d in sorted(g.nodes(data=True)):
        if d["kind"] == "tensor":
            t = d["payload"]
            tensors_used.append(TensorModel(t.name, t.kind, t.dtype, t.shape, t.symmetric))
    fms = tuple(FlagModel(f.name, f"F_{_ident(f.name)}", f.size, f.count, f.producer, ", ".join(f.key),
                          flag_no[f.name]) for f in flags(g))
    header = (
        f"source: {prog.file}",
        f"program: {prog.name}   world: {prog.world}   schedule: {schedule}",
        "passes: " + ", ".join(g.graph.get("passes", ())),
        "dims: " + " ".join(f"{k}={v}" for k, v in prog.dims) + "   tiles: " + " ".join(f"{k}={v}" for k, v in
                                                                                       prog.tiles),
        "launch: " + f"num_warps={options.get('num_warps', 4)} num_stages={options.get('num_stages', 3)}"
        f" group_m={options.get('group_m', 8)}",
    )
    return ModuleModel(header, prog.name, prog.world, schedule, tuple(tensors_used), fms, tuple(kernels),
                       options.get("num_warps", 4), options.get("num_stages", 3), _peers_touch_user_tensors(g),
                       _library(g), slots or 0, bool(options.get("noinline_tasks")))


def _library(g: nx.DiGraph) -> tuple[str, ...]:
    from tilec.ir.graph import stages
    from tilec.ir.types import walk

    used = {x.fn for st in stages(g) for s in st.body for x in walk(s.value) if isinstance(x, TupleCall)}
    return tuple(sorted(used))


def _peers_touch_user_tensors(g: nx.DiGraph) -> bool:
    """Whether, after the last barrier, a rank reads or writes another rank's copy of an `in`/`out` tensor. Then
    a call must end with a barrier, or a fast rank could overwrite its inputs while a peer still reads them."""
    last: list = []
    for n in g.graph["order"]:
        last = [] if g.nodes[n]["kind"] == "barrier" else [*last, g.nodes[n]["payload"]]
    for st in last:
        for r in st.reads():
            a = r.source if isinstance(r, Pull) else r.access
            # a pull reads its source on the rank that ran the copy: a peer when the buffer read was remote
            remote = a.remote or (isinstance(r, Pull) and r.read.remote)
            if remote and tensor(g, a.tensor).kind != "buf":
                return True
        if any(s.access.remote and tensor(g, s.access.tensor).kind != "buf" for s in st.body):
            return True
    return False


def _kernel(g: nx.DiGraph, k: Kernel, flag_no: dict[str, int], scopes: dict[str, str], group_m: int, share: float,
            start_local: bool = False, timeline_base: int | None = None, attend_block: int = 64) -> KernelModel:
    lines: list[str] = []
    params: list[str] = []
    tasks: list[TaskFn] = []
    world = g.graph["program"].world
    offset = 0
    total = sum(_trips(stage(g, s).loops) for s in k.stages)
    if k.groups:  # program group i covers pids [lo_i, lo_i + n_i); every group has at least one program
        cum = [sum(k.groups[:i]) for i in range(len(k.groups) + 1)]
        span = f"(NPROG - {len(k.groups)})"
        bounds = [f"({i} + {span} * {c} // {cum[-1]})" for i, c in enumerate(cum)]
        bounds[0], bounds[-1] = "0", "NPROG"
        lines.append(f"# workgroup specialization: programs per stage in proportion {', '.join(map(str, k.groups))}")
    for i, sname in enumerate(k.stages):
        st = stage(g, sname)
        n = _trips(st.loops)
        em = _Emitter(g, st, flag_no, scopes, attend_block)
        has_sum = any(isinstance(x.value, Sum) for x in st.body)
        mark = None if timeline_base is None else (timeline_base + offset, [x.name for x in stages(g)].index(sname))
        body = em.task("t", group_m if has_sum else 1, mark)
        call = f"_task_{k.name}_{sname}"
        if len(k.stages) > 1:
            tasks.append(TaskFn(call, tuple(body)))
        if k.groups:
            lo, hi = bounds[i], bounds[i + 1]
            cond = "if" if i == 0 else "elif" if i < len(k.stages) - 1 else "else"
            lines.append(f"{cond} pid < {hi}:  # stage {sname}" if cond != "else" else f"else:  # stage {sname}")
            lines.append(f"    for task in range(pid - {lo}, {n}, {hi} - {lo}):")
            lines.append(f"        {call}({_rotated('task', n, start_local, world)}, ARGS)")
        elif len(k.stages) == 1:
            lines += [f"t = {_rotated('task', n, start_local, world)}"] + [b[4:] for b in body]
        else:
            cond = "if" if i == 0 else "elif" if i < len(k.stages) - 1 else "else"
            test = f" task < {offset + n}" if cond != "else" else ""
            lines.append(f"{cond}{test}:")
            local = f"task - {offset}" if offset else "task"
            lines.append(f"    {call}({_rotated(local, n, start_local, world)}, ARGS)")
        offset += n
        for p in em.params:
            if p not in params:
                params.append(p)
    args = ", ".join([*params, "ERR, heap_bases, rank, epoch, max_spin, UPCAST_DOT"])
    lines = [ln.replace("ARGS", args) for ln in lines]
    return KernelModel(k.name, k.stages, tuple(params), tuple(lines), total, k.persistent, k.concurrent,
                       k.barrier_before, share, len(k.groups), tuple(tasks))


def _rotated(t: str, n: int, on: bool, world: int) -> str:
    """start_local: rank q starts its stage's tasks at q/W of the way round (its own rows, its own shard first),
    so programs do not all begin by waiting on the same peer; every task is still run exactly once."""
    if not on or world == 1 or n < world:
        return t
    return f"({t} + rank * {n // world}) % {n}"


def _trips(loops) -> int:
    n = 1
    for v in loops:
        n *= v.trips
    return n
