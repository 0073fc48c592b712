"""Emitting one task of a stage: decode its loop variables from the task number, wait, compute, store, release."""

from __future__ import annotations

import math
import re
from dataclasses import replace

from tilec.errors import TilecError
from tilec.ir.dtypes import TL_DTYPE
from tilec.ir.gather import Gathered
from tilec.ir.graph import flags, folds, program_of, tensor
from tilec.ir.types import ME, Access, Load, Store, Var, squeeze

from . import gathers, tile_ops
from . import kir as K
from .build import At, Block, E, add, assign, call, cmp, fdiv, mod, mul, sub, to, tup

COMMENT_WIDTH = 116  # a stage's comment is cut to this many columns (the statement may be longer)


def statement_text(source: str, loc) -> str:
    """The .tile text of a statement's span, on one line."""
    lines = source.splitlines()[loc.line - 1: loc.end_line]
    if not lines:
        return ""
    if loc.end_col:
        lines[-1] = lines[-1][: loc.end_col - 1]
    lines[0] = lines[0][loc.col - 1:]
    return " ".join(re.sub(r"#.*", "", ln).strip() for ln in lines).strip()


def stage_comment(prog, st) -> str:
    """`# stage gemm (examples/ag_gemm.tile:16): C[m, n] = sum k in K by BK: Ag[m, k] @ B[k, n]`: the stage and the
    .tile statements it came from."""
    locs = list(dict.fromkeys(s.loc for s in st.body if s.loc is not None))
    if not locs:
        return f"# stage {st.name}"
    first, last = locs[0], locs[-1]
    span = f"{first.line}" if last.end_line <= first.line else f"{first.line}-{last.end_line}"
    text = "; ".join(statement_text(prog.source, loc) for loc in locs)
    out = f"# stage {st.name} ({first.file}:{span}): {text}"
    return out if len(out) <= COMMENT_WIDTH else out[: COMMENT_WIDTH - 3] + "..."


def piece_expr(p, loops, world: int):
    """A derived variable's value (ir/peers.Piece) as index arithmetic: the affine part made non-negative first
    (a multiple of the divisor added, taken back off a `//`), so `%` and `//` agree on every backend."""
    from tilec.ir.types import ME

    def ranges(names):
        out = {}
        for n in names:
            v = next((x for x in loops if x.name == n), None)
            if n == ME or v is None:
                out[n] = (0, world - 1)
            elif v.derived is not None:
                out[n] = v.derived.reach(ranges(v.derived.vars))
            else:
                out[n] = (0, max(v.extent - 1, 0))
        return out

    if not p.terms:  # a fixed rank (`X@0`): its value, already reduced
        return E(p.evaluate({}))
    lift = p.nonneg(ranges(p.vars))
    parts = [E(name) if k == 1 else mul(name, k) for name, k in p.terms]
    x = add(*parts, p.const + lift) if p.const + lift else add(*parts)
    if p.op == "%":
        return mod(x, p.by)
    return sub(fdiv(x, p.by), lift // p.by) if lift else fdiv(x, p.by)


COPY_TILE_ELEMENTS = 16384  # the most elements of a copy tile one program moves at once (64 per thread at 8 warps)


def wide_copy(st) -> tuple[Store, Var] | None:
    """A stage that only copies, `Y[.., :] = X[.., :]`, whose tile has more than COPY_TILE_ELEMENTS elements because of
    a `:` slice (a whole row of H): the copy chunked along the slice's columns, so a program holds one chunk at a
    time rather than spilling the tile (a 128 x 2048 f16 tile spilled 11840 bytes per thread on sm_90 and copied at
    a tenth of the bandwidth). Returns (the store with the chunk's shape, the slice's chunk var), or None. The task
    and its flags stay whole: only the emitted copy loops."""
    if len(st.body) != 1:
        return None
    s = st.body[0]
    v, a = s.value, s.access
    if type(v) is not Load or type(a) is not Access or s.part is not None or squeeze(v.shape) != squeeze(a.shape):
        return None  # a scatter's rows are claimed once per task: not chunked
    n = math.prod(a.shape)
    if n <= COPY_TILE_ELEMENTS:
        return None
    slices = {x.name: x for x in st.loops if x.name.startswith("_a") and x.trips == 1 and x.derived is None}
    dst = [t for t in a.tile if t]
    src = [t for t in v.access.tile if t]
    cols = [t for t in dst if t in slices]
    if not cols or len(src) != len(dst):
        return None
    whole = slices[cols[-1]]
    mine = src[dst.index(whole.name)]
    if mine != whole.name and (mine not in slices or slices[mine].extent != whole.extent):
        return None
    if isinstance(v.access, Gathered) and v.access.row(v.access.tile.index(mine)) is not None:
        return None  # the source's rows of that dim come from an index: not a range to chunk
    step = 1 << max(4, (COPY_TILE_ELEMENTS * whole.step // n).bit_length() - 1)
    if step >= whole.step:
        return None
    chunk = replace(whole, step=step)

    def narrowed(acc: Access, var: str) -> Access:  # the load's own `:` becomes the store's
        return replace(acc, index=tuple(ix.rename({var: whole.name}) for ix in acc.index),
                       tile=tuple(whole.name if t == var else t for t in acc.tile),
                       shape=tuple(step if t == var else m for t, m in zip(acc.tile, acc.shape, strict=True)))

    load = narrowed(v.access, mine)
    return replace(s, access=narrowed(a, whole.name), value=replace(v, access=load, shape=load.shape)), chunk


def _broadcasts(src: tuple, dst: tuple) -> bool:
    """Whether a value of shape src broadcasts to the tile dst: a scalar, or (numpy's rule) a shape of at most dst's
    rank whose dims, aligned at the last, are each equal to dst's or 1; one of lower rank that is the same tile up to
    unit dims is reshaped instead."""
    if src and len(src) < len(dst) and [n for n in src if n != 1] == [n for n in dst if n != 1]:
        return False
    return not src or (len(src) <= len(dst) and all(n in (1, d) for n, d in zip(src, dst[len(dst) - len(src):],
                                                                                   strict=True)))


class Tasks:
    """Mixin of _Emitter (emit.py): one whole task, as kernel-IR statements placed in order (build.At)."""

    def task(self, task_var: str, group_m: int, timeline: tuple[int, int] | None = None) -> list[At]:
        """The task's statements. timeline=(first slot, stage number): record when the task started, when its waits
        were done and when it finished (a debug build for `tilec taxes --timeline`)."""
        st = self.st
        head: list = [At("    ", K.Comment(stage_comment(program_of(self.g), st)[2:]))]
        wide = wide_copy(st)
        head += self.decode(task_var, group_m, skip_bind=wide[1].name if wide else None)
        body: list[At] = []
        stores = st.body
        if wide:  # a copy of a tile too large for a program's registers: its columns in chunks, one after another
            store, chunk = wide
            stores = (store,)
            # waited for before the chunks, planned on the whole tile (the scope's slice is still whole here: every
            # column's producers)
            for w in self.waits.pop(st.body[0].value.access, []):
                self.wait(w, body, "    ")
            whole = self.scope[chunk.name]
            self.scope[chunk.name] = chunk
            tile = " x ".join(map(str, st.body[0].access.shape))
            col = f"{chunk.name}_c"  # the slice's own variable stays 0: flag counters may name it
            body.append(At("    ", K.For(col, E(0), E(chunk.extent), E(chunk.step), (),
                                         f"a {tile} tile, {chunk.step} columns at a time")))
            self.bind_tile(chunk, body, "        ", hint=True, start=col)
        indent = "        " if wide else "    "
        for s in stores:
            val = self.expr(s.value, body, indent)
            a = s.access
            off, mask = gathers.store_offsets(self, a, body, indent)  # a scatter's rows, checked and claimed
            ptr = self.param(a.tensor)
            dt = TL_DTYPE[tensor(self.g, a.tensor).dtype]
            shape = tup(*a.shape)
            if s.part is not None:  # one result of a tile function, laid out as the target tile
                val = val[s.part]
                rshape = s.value.outs[s.part][1]
                if not rshape:
                    v = K.Bin("+", call("tl.zeros", shape, dtype="tl.float32"),
                              call("tl.max", call("tl.reshape", val, tup(1)), axis=0))
                else:
                    v = call("tl.reshape", val, shape)
            elif s.value.shape != a.shape and _broadcasts(s.value.shape, a.shape):
                v = call("tl.broadcast_to", tile_ops.padded(val, s.value, len(a.shape)), shape)
            elif s.value.shape != a.shape:  # same tile up to unit dims, e.g. a [BM, BN] sum into P[r, m, n], or
                # a [BM, 1] column into a [1, BM] row (Z[r, m] = Y[m, 0] * 2): not a broadcast
                v = call("tl.reshape", val, shape)
            else:
                v = val
            if a.remote:  # one peer per task: offset the local addresses once (iris.store translates every element's
                # address: a 128x64 copy tile took 16.4 us, 1.6 us with the offset, on the H200)
                delta = self.peer_offset(E(a.rank), tensor(self.g, a.tensor).dtype, {a.rank}, body, indent)
                body.append(At(indent, K.Do(call("store", add(ptr, delta, off), to(v, dt), mask=mask))))
            else:
                body.append(At(indent, K.Do(call("store", add(ptr, off), to(v, dt), mask=mask))))
        if wide:
            self.scope[chunk.name] = whole
        body = gathers.skip_empty(self, body)  # counted loops (ir/gather.py): a task past its count does nothing
        folded = {fo.flag: fo for fo in folds(self.g)}
        arrivals: list[At] = []  # fold-last: the consumer tasks this one may run, after its own record ends
        for f in flags(self.g):
            if f.producer == st.name:
                if f.name in folded:
                    self.arrive(folded[f.name], f, arrivals, "    ")
                else:
                    self.release(f, body, "    ")
        if timeline is None:
            lines = head + self.wait_lines + self.prologue + body + arrivals
        else:
            # the record ends before the arrivals: the folded consumer tasks keep records of their own, so a
            # task's time is never counted twice (the arrival's atomic shows between the two)
            slot, number = timeline
            tp = self.param("TIMELINE")
            lines = [*head, At("    ", assign("_tl_start", call("clock", "INTERPRET"))), *self.wait_lines,
                     At("    ", assign("_tl_waited", call("clock", "INTERPRET"))), *self.prologue, *body,
                     At("    ", K.Do(call("mark", add(tp, mul(add(slot, task_var), 5)), number, "_tl_start",
                                      "_tl_waited", "INTERPRET"))),
                     *arrivals]
        return lines

    def decode(self, task_var: str, group_m: int, skip_bind: str | None = None) -> list[At]:
        """The task's loop variables from its task number, and its tiles' index vectors. A stage that skips its
        rank loop's own value (Stage.skip_equal: local-in-place) counts W - 1 values of that variable: r' >= rank
        stands for r' + 1."""
        skip = self.skipped_rank()
        derived = [v for v in self.st.loops if v.derived is not None]  # peers, index pieces: computed below
        loops = [replace(v, extent=self.world - 1) if v.name == skip else v for v in self.st.loops
                 if v.derived is None]
        b = Block()
        tiles = [v for v in loops if not v.is_rank]
        grouped = group_m > 1 and len(loops) >= 2 and all(not v.is_rank and v.trips > 1 for v in loops[-2:])
        if grouped:  # the last two loops are the output tile's rows and columns; outer loops (e.g. ranks) wrap them
            m, n = loops[-2:]
            tv = task_var if len(loops) == 2 else f"{task_var}_mn"
            if tv != task_var:
                b.add(assign(tv, mod(task_var, m.trips * n.trips)))
            b.add(assign("g_size", mul(group_m, n.trips)),
                  assign("g_first", mul(fdiv(tv, "g_size"), group_m),
                         f"grouped order: {group_m} rows of {m.name}-tiles share the {n.name}-tiles in L2"),
                  assign("g_rows", call("tl.minimum", sub(m.trips, "g_first"), group_m)),
                  assign(m.name, mul(add("g_first", mod(mod(tv, "g_size"), "g_rows")), m.step)),
                  assign(n.name, mul(fdiv(mod(tv, "g_size"), "g_rows"), n.step)))
        outer = loops[:-2] if grouped else loops
        if outer:
            multi = [v for v in outer if v.trips > 1]
            for v in outer:
                if v.trips == 1:  # one-trip loops (and `:` slices) start at 0
                    b.add(assign(v.name, sub(1, "rank") if v.name == skip else 0,
                                 "the one peer" if v.name == skip else ""))
            # the trips of the loops inside this one: each variable is one division and one remainder
            div = m.trips * n.trips if grouped else 1
            for i, v in enumerate(reversed(multi)):
                q = E(task_var) if div == 1 else fdiv(task_var, div)
                val = q if i == len(multi) - 1 else mod(q, v.trips)
                if v.name == skip:
                    b.add(assign(v.name, add(val, call(K.Attr(cmp(val, ">=", "rank"), "to"), K.Attr(E("tl"), "int32"))),
                                 f"skips {v.name} == rank: the rows it holds"))
                else:
                    b.add(assign(v.name, val if v.step == 1 else mul(val, v.step)))
                div *= v.trips
        for v in derived:
            b.add(assign(v.name, piece_expr(v.derived, self.st.loops, self.world)))
        out = [At("    ", x) for x in b.done()]
        for v in tiles:
            if v.name == skip_bind:  # a wide copy's columns: bound chunk by chunk in its loop
                continue
            if v.step > 1 or v.name.startswith("_"):  # unit-step loops index like scalars (`:` slices do not)
                self.bind_tile(v, out, "    ", hint=v.step > 1)
        return out

    def skipped_rank(self) -> str | None:
        """The rank loop whose value equal to this rank the stage skips (Stage.skip_equal = ((r, rank),)), if any."""
        if not self.st.skip_equal:
            return None
        if len(self.st.skip_equal) != 1 or ME not in self.st.skip_equal[0]:
            raise TilecError(f"codegen: stage '{self.st.name}' skips {self.st.skip_equal}; only one rank loop against"
                             " `rank`")
        a, b = self.st.skip_equal[0]
        return a if b == ME else b
