"""A seeded generator of small .tile programs with data-dependent rows, each with a torch model of what it computes.

`generate(seed, world)` draws a chain of 1-3 stages joined by barriers, each writing a new tensor from an input or
from the previous stage's tensor:

- gather: `D[e*T + m, c] = f(S@P[idx[e*T + m], c])`, the outer loop `e` a rank loop (`r in ranks`) or a block loop
  (`e in E by 1`) or none, the peer P none, `rank`, `r` or `(rank + 1)`, f plain math or a GEMM with an input B
  (`sum k in H by BK: S[idx[m], k] @ B[k, n]`); indexes repeat;
- combine: `D[m, c] = sum k in K by 1: wt[m, k] * S@P[slot[k*T + m], c]` (a gather inside a reduction);
- scatter: `D[perm[m], c] = f(S@P[m, c])`, perm a random injection (distinct rows), always read by a next stage;
- copy: affine rows, a pull `D[r*R + m, c] = S@r[m, c]`, a push `D@r[rank*R + m, c] = S[m, c]` or local math (the
  copy stages the fused schedules and the copy engines take).

Any of them but combine may be a counted loop, `m in T by BT upto cnt[e]` (one count per block; a per-tile count
`cnt[e*T + m]` read at the tile's first row; `cnt[0]` without an outer loop), with counts drawn 0 (empty), T (full)
or ragged. Tile sizes need not divide the dims; tensors are f32 or f16.

The model (`GenRows.expect`) shares nothing with tilec: per rank it keeps every tensor as f32 values (NaN where
nothing defined was stored: rows past a count, rows a scatter skipped, rows computed from those) and which rows a
stage stored. `GenRows.inputs` draws a call's inputs (index values in range, a scatter's distinct), `GenRows.bad`
a call with one index or count out of range (or a repeated scatter row) on every rank and the message each rank's
IndexRangeError must carry.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

DTYPES = {"f32": torch.float32, "f16": torch.float16}
TOL = {"f32": 1e-4, "f16": 2e-2}
TILES = (1, 2, 4, 8, 16)  # a tile task costs milliseconds in the Triton interpreter: few tasks, mostly wide tiles


@dataclass
class Tensor:
    name: str
    kind: str  # in | out | buf
    dtype: str  # f32 | f16 | i32
    rows: int
    cols: int = 0  # 0: 1-D (i32 index and count tensors)
    symmetric: bool = False
    role: str = "data"  # data | index | perm | count | weight
    high: int = 0  # index values are rows 0..high-1; counts 0..high


@dataclass
class Stage:
    name: str
    kind: str  # gather | combine | scatter | copy
    text: str  # header and body lines
    run: object  # run(state, rank) -> None: the model of this stage on one rank
    checks: list = field(default_factory=list)  # (tensor, what, kind): an index (of what) or count (of extent)
    count: tuple | None = None  # (count tensor, extent, tile, per tile) of a counted loop


class _State:
    def __init__(self, g: GenRows, ins: list[dict[str, torch.Tensor]]):
        self.world = g.world
        self.vals: dict[str, list[torch.Tensor]] = {}
        self.stored: dict[str, list[torch.Tensor]] = {}
        for t in g.tensors.values():
            if t.kind == "in":
                self.vals[t.name] = [ins[p][t.name].float() if t.cols else ins[p][t.name].long()
                                     for p in range(g.world)]
            else:
                self.vals[t.name] = [torch.full((t.rows, t.cols), float("nan")) for _ in range(g.world)]
                self.stored[t.name] = [torch.zeros(t.rows, dtype=torch.bool) for _ in range(g.world)]

    def store(self, t: Tensor, rank: int, rows: torch.Tensor, value: torch.Tensor) -> None:
        self.vals[t.name][rank][rows] = value.to(DTYPES[t.dtype]).float()
        self.stored[t.name][rank][rows] = True


class GenRows:
    def __init__(self, seed: int, world: int):
        self.seed, self.world = seed, world
        self.rng = random.Random(seed * 7907 + world)
        self.name = f"rows_{seed}_w{world}"
        self.dtype = self.rng.choice(["f32", "f16"])
        self.tensors: dict[str, Tensor] = {}
        self.stages: list[Stage] = []
        self.kinds: set[str] = set()
        self.n = 0

    # -- tensors --
    def new(self, prefix: str, kind: str, dtype: str, rows: int, cols: int = 0, **kw) -> Tensor:
        self.n += 1
        t = Tensor(f"{prefix}{self.n}", kind, dtype, rows, cols, **kw)
        self.tensors[t.name] = t
        return t

    def data_dtype(self) -> str:
        return self.dtype if self.rng.random() < 0.8 else {"f32": "f16", "f16": "f32"}[self.dtype]

    def tile(self, extent: int) -> int:
        return self.rng.choice([b for b in TILES if b <= max(4, extent)] + [8, 16, 16])

    def cols(self, width: int) -> tuple[str, str, int]:
        """(loop header or "", the column index text, the tile width): the whole width `:` or a tile loop `n`."""
        if self.rng.random() < 0.6:
            return "", ":", width
        bn = self.rng.choice([b for b in (2, 4, 8, 16, 16) if b <= max(2, width)])
        return f", n in {width} by {bn}", "n", bn

    def elementwise(self, x: str, cols: str, rows_text: str, rows: int, width: int):
        """Text and model of f(x): x a tile read, f plain math (maybe with an affine input of the stage's shape)."""
        rng = self.rng
        pick = rng.randrange(6)
        if pick == 0:
            return x, lambda v, p, r: v
        if pick == 1:
            c = rng.choice([0.5, 2.0, -1.5])
            return f"{x} * {c}", lambda v, p, r: v * c
        if pick == 2:
            return f"relu({x} + 0.25)", lambda v, p, r: torch.relu(v + 0.25)
        if pick == 3:
            return f"tanh({x}) - 1.0", lambda v, p, r: torch.tanh(v) - 1.0
        q = self.new("Q", "in", self.data_dtype(), rows, width)
        if pick == 4:
            return f"{x} * {q.name}[{rows_text}, {cols}]", lambda v, p, r: v * self._q(q, p, r)
        return f"max({x}, {q.name}[{rows_text}, {cols}])", lambda v, p, r: torch.maximum(v, self._q(q, p, r))

    def _q(self, q: Tensor, p: int, rows: torch.Tensor) -> torch.Tensor:
        return self._st.vals[q.name][p][rows]

    def source(self, prev: Tensor | None, rows: int | None = None) -> Tensor:
        """The stage's source: the previous stage's tensor (mostly), else a new input (of `rows` rows if given)."""
        if prev is not None and (rows is None or prev.rows == rows) and self.rng.random() < 0.85:
            return prev
        width = prev.cols if prev is not None and self.rng.random() < 0.7 else self.rng.choice([3, 5, 8, 12, 16, 20])
        return self.new("X", "in", self.data_dtype(), rows or self.rng.randint(3, 32), width)

    def peer(self, src: Tensor, ranked: bool) -> tuple[str, object]:
        """(text after the tensor name, rank read as a function of (rank, outer value))."""
        w = self.world
        choices = [("", lambda p, e: p), ("@rank", lambda p, e: p), ("@(rank + 1)", lambda p, e: (p + 1) % w)]
        if ranked:
            choices += [("@r", lambda p, e: e)] * 3
        at, fn = self.rng.choice(choices if self.rng.random() < 0.8 else choices[:1])
        if at:  # `@rank` too: a peer access needs the symmetric heap
            src.symmetric = True
        return at, fn

    def counts(self, outer: str | None, nblocks: int, extent: int, bt: int):
        """(header suffix, count tensor or None, valid(rank, block) -> bool mask over the block's rows)."""
        rng = self.rng
        self._count = None
        if rng.random() < 0.45:
            return "", None, lambda p, e: torch.ones(extent, dtype=torch.bool)
        per_tile = outer is not None and rng.random() < 0.35
        c = self.new("cnt", "in", "i32", nblocks * extent if per_tile else max(1, nblocks), role="count", high=extent)
        self._count = (c, extent, bt, per_tile)
        if per_tile:  # one count per block of rows, read at the block's first row (moe.tile's dend)
            text = f" upto {c.name}[{outer}*{extent} + m]"

            def valid(p, e):
                cnt = self._st.vals[c.name][p][e * extent:(e + 1) * extent]
                i = torch.arange(extent)
                return i < cnt[(i // bt) * bt]
        else:
            text = f" upto {c.name}[{outer or 0}]"

            def valid(p, e):
                return torch.arange(extent) < self._st.vals[c.name][p][e]
        return text, c, valid

    # -- stages --
    def gather(self, i: int, prev: Tensor | None) -> Stage:
        rng, w = self.rng, self.world
        src = self.source(prev)
        outer = rng.choice([None, "r", "e"])
        nb = w if outer == "r" else rng.randint(1, 3) if outer == "e" else 1
        T = rng.randint(1, 18)
        bt = self.tile(T)
        idx = self.new("idx", "in", "i32", nb * T, role="index", high=src.rows)
        head = {"r": "r in ranks, ", "e": f"e in {nb} by 1, "}.get(outer, "")
        upto, cnt, valid = self.counts(outer, nb, T, bt)
        at, who = self.peer(src, outer == "r")
        row = f"{outer}*{T} + m" if outer else "m"
        gemm = rng.random() < 0.35
        if gemm:
            ho = rng.choice([2, 4, 8, 12, 16])
            bn, bk = rng.choice([b for b in (2, 4, 8, 16) if b <= max(2, ho)]), rng.choice([2, 4, 8, 16])
            b = self.new("B", "in", src.dtype, src.cols, ho)
            dst = self.new("D", "buf", self.data_dtype(), nb * T, ho)
            act = rng.choice(["", "relu"])
            body = f"sum k in {src.cols} by {bk}: {src.name}{at}[{idx.name}[{row}], k] @ {b.name}[k, n]"
            text = (f"  stage s{i} over {head}m in {T} by {bt}{upto}, n in {ho} by {bn}:\n"
                    f"    {dst.name}[{row}, n] = {f'{act}({body})' if act else body}\n")

            def f(v, p, r):
                y = v.double().matmul(self._st.vals[b.name][p].double()).float()
                return torch.relu(y) if act else y
        else:
            chead, ctext, _bn = self.cols(src.cols)
            dst = self.new("D", "buf", self.data_dtype(), nb * T, src.cols)
            expr, f = self.elementwise(f"{src.name}{at}[{idx.name}[{row}], {ctext}]", ctext, row, nb * T, src.cols)
            text = f"  stage s{i} over {head}m in {T} by {bt}{upto}{chead}:\n    {dst.name}[{row}, {ctext}] = {expr}\n"

        def run(st: _State, p: int):
            for e in range(nb):
                ok = valid(p, e)
                rows = st.vals[idx.name][p][e * T:(e + 1) * T][ok]
                out = torch.arange(e * T, (e + 1) * T)[ok]
                st.store(dst, p, out, f(st.vals[src.name][who(p, e)][rows], p, out))

        s = Stage(f"s{i}", "gather" + ("-gemm" if gemm else ""), text, run, count=self._count)
        s.checks.append((idx, src, "index"))
        if cnt is not None:
            s.checks.append((cnt, T, "count"))
        return s, dst

    def combine(self, i: int, prev: Tensor | None) -> Stage:
        rng = self.rng
        src = self.source(prev)
        T, K = rng.randint(1, 16), rng.randint(1, 3)
        bt = self.tile(T)
        slot = self.new("slot", "in", "i32", K * T, role="index", high=src.rows)
        wt = self.new("wt", "in", "f32", T, K, role="weight")
        at, who = self.peer(src, False)
        chead, ctext, _bn = self.cols(src.cols)
        dst = self.new("D", "buf", self.data_dtype(), T, src.cols)
        text = (f"  stage s{i} over m in {T} by {bt}{chead}:\n"
                f"    {dst.name}[m, {ctext}] = sum k in {K} by 1: {wt.name}[m, k] * "
                f"{src.name}{at}[{slot.name}[k*{T} + m], {ctext}]\n")

        def run(st: _State, p: int):
            s = st.vals[src.name][who(p, 0)]
            rows = st.vals[slot.name][p].view(K, T)
            wv = st.vals[wt.name][p]
            acc = sum(wv[:, k:k + 1] * s[rows[k]] for k in range(K))
            st.store(dst, p, torch.arange(T), acc)

        s = Stage(f"s{i}", "combine", text, run)
        s.checks.append((slot, src, "index"))
        return s, dst

    def scatter(self, i: int, prev: Tensor | None) -> Stage:
        rng = self.rng
        src = self.source(prev)
        T = src.rows
        bt = self.tile(T)
        n = T + rng.choice([0, 0, 1, 5])
        perm = self.new("perm", "in", "i32", T, role="perm", high=n)
        upto, cnt, valid = self.counts(None, 1, T, bt)
        at, who = self.peer(src, False)
        chead, ctext, _bn = self.cols(src.cols)
        dst = self.new("D", "buf", self.data_dtype(), n, src.cols)
        expr, f = self.elementwise(f"{src.name}{at}[m, {ctext}]", ctext, "m", T, src.cols)
        text = f"  stage s{i} over m in {T} by {bt}{upto}{chead}:\n    {dst.name}[{perm.name}[m], {ctext}] = {expr}\n"

        def run(st: _State, p: int):
            ok = valid(p, 0)
            m = torch.arange(T)[ok]
            st.store(dst, p, st.vals[perm.name][p][ok], f(st.vals[src.name][who(p, 0)][m], p, m))

        s = Stage(f"s{i}", "scatter", text, run, count=self._count)
        s.checks.append((perm, dst, "index"))
        s.checks.append((perm, dst, "twice"))
        if cnt is not None:
            s.checks.append((cnt, T, "count"))
        return s, dst

    def copy(self, i: int, prev: Tensor | None) -> Stage:
        rng, w = self.rng, self.world
        src = self.source(prev)
        R = src.rows
        bm = self.tile(R)
        how = rng.choice(["pull", "pull", "push", "math"])
        chead, ctext, _bn = self.cols(src.cols)
        dst = self.new("D", "buf", self.data_dtype(), R if how == "math" else w * R, src.cols)
        upto, cnt, valid = self.counts(None if how == "math" else "r", 1 if how == "math" else w, R, bm)
        if how == "math":
            at, who = self.peer(src, False)
            expr, f = self.elementwise(f"{src.name}{at}[m, {ctext}]", ctext, "m", R, src.cols)
            text = f"  stage s{i} over m in {R} by {bm}{upto}{chead}:\n    {dst.name}[m, {ctext}] = {expr}\n"

            def run(st: _State, p: int):
                m = torch.arange(R)[valid(p, 0)]
                st.store(dst, p, m, f(st.vals[src.name][who(p, 0)][m], p, m))
        elif how == "pull":
            src.symmetric = True
            text = (f"  stage s{i} over r in ranks, m in {R} by {bm}{upto}{chead}:\n"
                    f"    {dst.name}[r*{R} + m, {ctext}] = {src.name}@r[m, {ctext}]\n")

            def run(st: _State, p: int):
                for r in range(w):
                    m = torch.arange(R)[valid(p, r)]
                    st.store(dst, p, r * R + m, st.vals[src.name][r][m])
        else:  # push: rank p stores its rows into every rank's copy; the count is the pusher's
            dst.symmetric = True
            text = (f"  stage s{i} over r in ranks, m in {R} by {bm}{upto}{chead}:\n"
                    f"    {dst.name}@r[rank*{R} + m, {ctext}] = {src.name}[m, {ctext}]\n")

            def run(st: _State, p: int):
                for q in range(w):  # the model runs rank by rank: rank p's stage body as every pusher q into p
                    m = torch.arange(R)[valid(q, p)]
                    st.store(dst, p, q * R + m, st.vals[src.name][q][m])
        s = Stage(f"s{i}", f"copy-{how}", text, run, count=self._count)
        if cnt is not None:
            s.checks.append((cnt, R, "count"))
        return s, dst

    def program(self) -> GenRows:
        rng = self.rng
        n = rng.choice([1, 2, 2, 3, 3])
        prev = None
        i = 0
        while i < n:
            kinds = ["gather", "gather", "combine", "copy"] + (["scatter"] if i < 2 else [])
            kind = rng.choice(kinds)
            s, prev = getattr(self, kind)(i, prev)
            self.stages.append(s)
            self.kinds.add(s.kind)
            if kind == "scatter" and i == n - 1:
                n += 1  # a scatter's rows are read by a next stage (over the barrier: it waits for every task)
            i += 1
        for t in self.tensors.values():
            if t.kind == "buf" and (t is prev or rng.random() < 0.4):
                t.kind = "out"
        self.text = self.render()
        return self

    def render(self) -> str:
        lines = [f"# generated by tests/gen_rows.py: seed {self.seed}, world {self.world}",
                 f"program {self.name}(world W)", "  dims  H = 1", ""]
        for t in sorted(self.tensors.values(), key=lambda t: t.kind != "in"):
            shape = f"{t.rows}, {t.cols}" if t.cols else f"{t.rows}"
            lines.append(f"  {t.kind:<3} {t.name} : {t.dtype}[{shape}]" + (" symmetric" if t.symmetric else ""))
        lines.append("")
        body = "  barrier\n".join(s.text for s in self.stages)
        return "\n".join(lines) + "\n" + body

    # -- calls --
    def inputs(self, seed: int) -> list[dict[str, torch.Tensor]]:
        """One call's inputs on every rank: data normal, index values in range (repeating), a scatter's rows
        distinct, counts 0, full or ragged."""
        g = torch.Generator().manual_seed(seed)
        out = []
        for _p in range(self.world):
            ins = {}
            for t in self.tensors.values():
                if t.kind != "in":
                    continue
                if t.role == "index":
                    v = torch.randint(0, t.high, (t.rows,), generator=g)
                    if t.rows > 2 and bool(torch.rand(1, generator=g) < 0.5):
                        v[: t.rows // 2] = v[0]  # a run of one row
                elif t.role == "perm":
                    v = torch.randperm(t.high, generator=g)[: t.rows]
                elif t.role == "count":
                    pick = torch.randint(0, 4, (t.rows,), generator=g)
                    ragged = torch.randint(0, t.high + 1, (t.rows,), generator=g)
                    v = torch.where(pick == 0, 0, torch.where(pick == 1, t.high, ragged))
                elif t.role == "weight":
                    v = torch.rand(t.rows, t.cols, generator=g)
                else:
                    v = torch.randn(t.rows, t.cols, generator=g)
                ins[t.name] = v.to(torch.int32) if t.dtype == "i32" else v.to(DTYPES[t.dtype])
            out.append(ins)
        return out

    def expect(self, ins: list[dict[str, torch.Tensor]]):
        """Per rank {out: (values in f32, NaN where undefined; rows stored)}."""
        self._st = st = _State(self, ins)
        for s in self.stages:
            for p in range(self.world):
                s.run(st, p)
        return [{n: (st.vals[n][p], st.stored[n][p]) for n, t in self.tensors.items() if t.kind == "out"}
                for p in range(self.world)]

    @property
    def tol(self) -> float:
        return max(TOL[t.dtype] for t in self.tensors.values() if t.dtype in TOL)

    def where(self, name: str, line_of: str) -> str:
        """`file:line:col` of the first `name[` on the first line containing `line_of`."""
        for no, line in enumerate(self.text.splitlines(), 1):
            if line_of in line and f"{name}[" in line:
                return f"{self.name}.tile:{no}:{line.index(f'{name}[') + 1}"
        raise AssertionError((name, line_of))

    def bad(self, seed: int, prefer: str | None = None):
        """(inputs, messages, kind) of a call with one offence per rank: an index out of range ("index"), a count
        past its extent ("count") or a scatter's repeated row ("twice"), a seeded pick among the program's checks
        (of kind `prefer` where it has one); None where the pick reads no element in this call."""
        rng = random.Random(seed)
        picks = [(s, c) for s in self.stages for c in s.checks]
        stage, (tensor, what, kind) = rng.choice([x for x in picks if x[1][2] == prefer] or picks)
        ins = self.inputs(seed)
        msgs = []
        header = stage.text.splitlines()[0]
        for p in range(self.world):
            v = ins[p][tensor.name]
            if kind == "count":
                el = 0 if stage.count[3] else rng.randrange(tensor.rows)  # per tile: read at tile starts only
                val = what + rng.randint(1, 9)
                v[el] = val
                at = self.where(tensor.name, header)
                msgs.append(f"rank {p}: count out of range: {tensor.name}[{el}] = {val} is not a count of the {what}"
                             f" rows of loop 'm' (0..{what}) at {at}; ")
                continue
            el = self._live(stage, tensor, ins[p], rng)
            if el is None:
                return None
            at = self.where(tensor.name, stage.text.splitlines()[1])
            if kind == "twice":
                other = rng.choice([j for j in self._live_all(stage, tensor, ins[p]) if j != el] or [None])
                if other is None:
                    return None
                v[max(el, other)] = v[min(el, other)]
                val = int(v[min(el, other)])
                msgs.append(rf"rank {p}: rows not distinct: {tensor.name}\[({el}|{other})\] = {val} names a row of"
                             f" dim 0 of '{what.name}' that another element of this call's scatter at {at} also "
                             "writes; only the first write of that row was stored")
                continue
            val = rng.choice([what.rows + rng.randint(0, 9), -rng.randint(1, 9)])
            v[el] = val
            msgs.append(f"rank {p}: index out of range: {tensor.name}[{el}] = {val} is not a row of dim 0 of"
                        f" '{what.name}' (0..{what.rows - 1}) at {at}; that row was not read or written")
        return ins, msgs, kind

    def _live_all(self, stage: Stage, tensor: Tensor, ins) -> list[int]:
        """The elements of an index tensor the stage reads in this call (lanes below their counts)."""
        live = torch.ones(tensor.rows, dtype=torch.bool)
        if stage.count is not None:
            c, extent, bt, per_tile = stage.count
            cnt = ins[c.name].long()
            i = torch.arange(tensor.rows)
            if per_tile:  # the count at the tile's first row
                live &= (i % extent) < cnt[(i // extent) * extent + ((i % extent) // bt) * bt]
            else:
                live &= (i % extent) < cnt[i // extent]
        return [int(j) for j in torch.nonzero(live).flatten()]

    def _live(self, stage, tensor, ins, rng) -> int | None:
        live = self._live_all(stage, tensor, ins)
        return rng.choice(live) if live else None


def generate(seed: int, world: int) -> GenRows:
    """The program of `seed` for `world` ranks."""
    return GenRows(seed, world).program()
