"""A seeded generator of valid .tile programs, each with a torch model of what it computes.

`generate(seed, world)` draws a random plan and returns its program text and its model. A plan is a chain of 1-4
stages, each writing a new tensor: tile copies (local, pulled from a peer `X@r[...]`, pushed into a peer
`Y@r[...] = ...`), elementwise math, GEMMs `sum k in K by BK: A[m, k] @ B[k, n]` (alone, or two over one k
sharing A: `silu(A @ B) * (A @ B2)`, `(A @ B) + (A @ B2)`) and sums over ranks
`sum s in ranks: X@s[...]`. Indexes are a loop part (`m`, a scalar loop `j`, or both: `j*BS + m`) plus terms in
`rank`, the stage's rank loop `r` or the sum's `s`, and constant offsets (`r*M/W + m`, `m + rank`, `s*R + m + 1`);
dims are multiples of the tiles or not (ragged), tiles are powers of two (1 included).

The model evaluates the plan block by block: for each value of the variables that are not tile loops (the
executing rank, rank loops, scalar loops), a tile loop spans its whole extent, so every access is one slice and a
stage is a few torch ops per block. It shares nothing with tilec (not the parser, not the IR, not
tilec/reference.py). The same evaluation keeps the programs well defined: every element a stage reads is an input
or was written by an earlier stage on the rank read, no element is written twice in a stage (by any rank), and
every access is in bounds; a draw that breaks one of these is drawn again.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

import torch

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
TOL = {"f16": 2e-2, "bf16": 6e-2, "f32": 1e-4}
# the Triton interpreter runs a task in milliseconds: programs stay small so that many fit in a test run
MAX_TASKS = 32  # tile tasks (times k-steps of a GEMM) per stage and rank
MAX_ELEMS = 4096  # elements per tensor


class Invalid(Exception):
    """A drawn stage is not well defined (reads what nobody wrote, or writes an element twice)."""


# -- plan ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Frame:
    """How a stage walks one dim: `m in E by B` (tile), `j in NB by 1, m in S by B` (split: `j*S + m`), `j in E by
    1` (scalar: one element per task). `length` elements per value of the scalar var."""

    kind: str  # tile | split | scalar | point (no loop: the index is its other terms, e.g. `T[r, n]`)
    tile: str | None
    scalar: str | None
    nb: int
    length: int
    step: int
    loops: tuple[str, ...]  # loop headers
    part: str  # the index text

    @property
    def total(self) -> int:
        return {"split": self.nb * self.length, "scalar": self.nb, "point": 1}.get(self.kind, self.length)

    def offset(self, env: dict[str, int]) -> int:
        j = env[self.scalar] if self.scalar else 0
        return j * self.length if self.kind == "split" else j

    @property
    def trips(self) -> int:
        per = -(-self.length // self.step) if self.kind != "scalar" else 1
        return self.nb * per

    @property
    def span(self) -> int:  # elements one task (all tiles of the tile var) covers per scalar value
        return 1 if self.kind in ("scalar", "point") else self.length


@dataclass(frozen=True)
class Idx:
    """One dim of an access: frame part (None: a single element) + sum coef*outer var + const."""

    frame: Frame | None
    terms: tuple[tuple[str, int, str], ...]  # (var, coef, coef text)
    const: int
    frame_last: bool = False

    def start(self, env: dict[str, int]) -> int:
        s = self.frame.offset(env) if self.frame else 0
        return s + sum(k * env[v] for v, k, _ in self.terms) + self.const

    @property
    def length(self) -> int:
        return self.frame.span if self.frame else 1

    def text(self) -> str:
        parts = [v if k == 1 else f"{v}*{t}" for v, k, t in self.terms]
        if self.const:
            parts.append(str(self.const))
        if self.frame and self.frame.part:
            parts.insert(len(parts) if self.frame_last else 0, self.frame.part)
        return " + ".join(parts) or "0"


@dataclass(frozen=True)
class Load:
    tensor: str
    peer: str | None  # None: local; a rank variable; "rank" (local, spelled as a peer)
    index: tuple[Idx, Idx]

    def text(self) -> str:
        at = f"@{self.peer}" if self.peer else ""
        return f"{self.tensor}{at}[{self.index[0].text()}, {self.index[1].text()}]"


@dataclass(frozen=True)
class Node:
    """Tile math: op in const | rankval | var | fn | bin | gemm | rsum; args are Nodes or Loads."""

    op: str
    args: tuple = ()
    attr: object = None

    def text(self) -> str:
        a = [x.text() for x in self.args]
        if self.op == "const":
            return repr(float(self.attr))
        if self.op == "var":
            return f"({self.attr} + 1)"
        if self.op == "fn":
            return f"{self.attr}({', '.join(a)})"
        if self.op == "bin":  # a sum as an operand is parenthesized: its body would run on to the end
            a = [f"({t})" if isinstance(x, Node) and x.op in ("gemm", "rsum") else t
                 for x, t in zip(self.args, a, strict=True)]
            return f"({a[0]} {self.attr} {a[1]})"
        if self.op == "gemm":
            kloop, f32 = self.attr
            lhs, rhs = (f"f32({x})" for x in a) if f32 else a
            return f"sum {kloop}: {lhs} @ {rhs}"
        if self.op == "rsum":
            return f"sum {self.attr} in ranks: {a[0]}"
        raise AssertionError(self.op)


@dataclass
class Tensor:
    name: str
    kind: str  # in | out | buf
    dtype: str
    shape: tuple[int, int]
    symmetric: bool
    shape_text: tuple[str, str] = ("", "")


@dataclass
class Stage:
    name: str
    loops: list[str]
    outer: list[tuple[str, int]]  # non-tile vars and their number of values (rank loops, scalar loops)
    dest: Load
    value: Node | Load
    barrier: bool = True

    def text(self) -> str:
        return f"  stage {self.name} over {', '.join(self.loops)}:\n    {self.dest.text()} = {self.value.text()}\n"


@dataclass
class GenProgram:
    """A generated program: its text, its tensors and stages, and `expect` (the torch model)."""

    name: str
    world: int
    seed: int
    text: str
    tensors: dict[str, Tensor]
    stages: list[Stage]
    plain: tuple[str, ...] = ()  # non-symmetric inputs passed as ordinary tensors
    kinds: set[str] = field(default_factory=set)  # which stage kinds it has (for coverage checks)

    @property
    def tol(self) -> float:
        return max(TOL[t.dtype] for t in self.tensors.values())

    def expect(self, ins: list[dict[str, torch.Tensor]]) -> list[dict[str, tuple[torch.Tensor, torch.Tensor]]]:
        """ins[rank] = {input: tensor} -> per rank {output: (values in f32, mask of the elements written)}."""
        st = _State(self.world, self.tensors)
        for name, t in self.tensors.items():
            if t.kind == "in":
                st.vals[name] = [ins[p][name].float() for p in range(self.world)]
        for s in self.stages:
            st.run(s)
        return [{n: (st.vals[n][p], st.defined[n][p]) for n, t in self.tensors.items() if t.kind == "out"}
                for p in range(self.world)]


# -- the model ----------------------------------------------------------------------------------------------------


RING_PEERS = ("(rank + r)", "(rank + r + 1)", "(rank - r)", "(rank - r - 1)")
FIXED_PEERS = ("(0)", "(1)", "(3)")  # the same rank in every task, modulo the world (a broadcast from it)


def peer_rank(peer: str | None, env: dict[str, int], world: int) -> int:
    """The rank a load's peer names: this one (None, "rank"), a rank variable's, or a ring peer's (RING_PEERS:
    `rank` and `r` with coefficients +-1 and a constant, modulo the world; FIXED_PEERS: a constant alone)."""
    if peer in (None, "rank"):
        return env["rank"]
    if peer in env:
        return env[peer]
    terms = peer.strip("()").replace("- ", "+ -").split(" + ")
    total = 0
    for t in terms:
        sign, name = (-1, t[1:]) if t.startswith("-") else (1, t)
        total += sign * (int(name) if name.isdigit() else env[name])
    return total % world


class _State:
    """Every rank's copy of every tensor (f32 values as stored) and which of its elements were written."""

    def __init__(self, world: int, tensors: dict[str, Tensor]):
        self.world, self.tensors = world, tensors
        self.vals: dict[str, list[torch.Tensor]] = {}
        self.defined: dict[str, list[torch.Tensor]] = {}
        for n, t in tensors.items():
            full = t.kind == "in"
            self.defined[n] = [torch.full(t.shape, full, dtype=torch.bool) for _ in range(world)]
            self.vals[n] = [torch.zeros(t.shape) if full else torch.full(t.shape, float("nan")) for _ in range(world)]

    def _slices(self, a: Load, env: dict[str, int]) -> tuple[int, tuple[slice, slice]]:
        rank = peer_rank(a.peer, env, self.world)
        sl = []
        for d, ix in enumerate(a.index):
            s = ix.start(env)
            if s < 0 or s + ix.length > self.tensors[a.tensor].shape[d]:
                raise Invalid(f"{a.text()} out of bounds")
            sl.append(slice(s, s + ix.length))
        return rank, (sl[0], sl[1])

    def load(self, a: Load, env: dict[str, int]) -> torch.Tensor:
        rank, sl = self._slices(a, env)
        if not bool(self.defined[a.tensor][rank][sl].all()):
            raise Invalid(f"{a.text()} reads elements nobody wrote on rank {rank}")
        return self.vals[a.tensor][rank][sl]

    def eval(self, e, env: dict[str, int]) -> torch.Tensor:
        if isinstance(e, Load):
            return self.load(e, env)
        if e.op == "const":
            return torch.tensor(float(e.attr))
        if e.op == "var":
            return torch.tensor(float(env[e.attr] + 1))
        if e.op == "gemm":
            a, b = (self.eval(x, env) for x in e.args)
            return a.double().matmul(b.double()).float()
        if e.op == "rsum":
            return sum(self.eval(e.args[0], {**env, e.attr: s}) for s in range(self.world))
        x = [self.eval(a, env) for a in e.args]
        if e.op == "bin":
            return {"+": torch.add, "-": torch.sub, "*": torch.mul, "/": torch.div}[e.attr](*x)
        return FNS[e.attr](*x)

    def run(self, s: Stage) -> None:
        t = self.tensors[s.dest.tensor]
        count = [torch.zeros(t.shape, dtype=torch.int32) for _ in range(self.world)]
        names = ["rank"] + [v for v, _ in s.outer]
        for vals in itertools.product(range(self.world), *(range(n) for _, n in s.outer)):
            env = dict(zip(names, vals, strict=True))
            x = self.eval(s.value, env)
            rank, sl = self._slices(s.dest, env)
            block = self.vals[t.name][rank][sl]
            block.copy_(x.expand(block.shape).to(DTYPES[t.dtype]).float())
            self.defined[t.name][rank][sl] = True
            count[rank][sl] += 1
        if any(bool((c > 1).any()) for c in count):
            raise Invalid(f"stage {s.name} writes an element of {t.name} twice")


def _silu(x):
    return x * torch.sigmoid(x)


FNS = {"relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "abs": torch.abs, "exp": torch.exp,
       "log": torch.log, "sqrt": torch.sqrt, "silu": _silu, "max": torch.maximum, "min": torch.minimum,
       "f32": lambda x: x}


# -- the generator ------------------------------------------------------------------------------------------------


class _Gen:
    def __init__(self, seed: int, world: int, focus: bool | str = False, dtype: str | None = None):
        self.focus, self.main_dtype = focus, dtype
        self.rng = random.Random(seed * 7919 + world)
        # draws that add a sibling GEMM (a second sum over the same k sharing the A tile, as SwiGLU's): a stream of
        # their own, so the programs that get none are the ones this seed always made
        self.sibling_rng = random.Random(seed * 104729 + world)
        self.seed, self.world = seed, world
        rng = self.rng
        small = [1, 2, 3, 5, 7, 8, 12, 16, 17, 24]
        self.bs = rng.choice([2, 4, 8])
        self.R = rng.choice(small + [self.bs * rng.randint(1, 3)] * 4)  # often a multiple of BS: `R/BS` loops
        self.C, self.K = rng.choice(small), rng.choice(small)
        self.tile_vals = {"BM": rng.choice([1, 2, 4, 8, 8, 16, 32]), "BN": rng.choice([1, 2, 4, 8, 16, 16]),
                          "BK": rng.choice([2, 4, 8, 16]), "BS": self.bs}
        w = world
        # texts a size or coefficient may be written as, by value
        self.names: dict[int, list[str]] = {}
        for text, v in (("R", self.R), ("M/W", self.R), ("C", self.C), ("K", self.K), ("M", self.R * w),
                        ("R*W", self.R * w), ("W*C", w * self.C), ("W", w), ("BS", self.bs)):
            self.names.setdefault(v, []).append(text)
        self.tensors: dict[str, Tensor] = {}
        self.stages: list[Stage] = []
        self.kinds: set[str] = set()
        self.n_in = 0

    # -- texts --
    def num(self, v: int, bare: bool = False) -> str:
        """v as a dim expression when one fits (most of the time), else a literal; `bare`: a single product (it
        becomes a coefficient: `r*M/W`), never `R + 3`."""
        texts = self.names.get(v, [])
        if texts and self.rng.random() < 0.8:
            return self.rng.choice(texts)
        base = [(b, t) for b, ts in self.names.items() for t in ts if 0 < b < v]
        if base and not bare and self.rng.random() < 0.3:
            b, t = self.rng.choice(base)
            return f"{t} + {v - b}"
        return str(v)

    # -- frames --
    def frame(self, tile: str, scalar: str, extent: int | None = None, tile_only: bool = False) -> Frame:
        rng = self.rng
        e = extent or rng.choice([self.R, self.C, self.K, self.R * self.world, rng.randint(1, 20)])
        step_name = rng.choice(["BM", "BN", "BM", "BN", "BK"] if tile != "k" else ["BK", "BK", "BM"])
        step = self.tile_vals[step_name]
        kind = "tile" if tile_only else rng.choices(["tile", "split", "scalar", "point"],
                                                    [6, 2, 1, 1 if tile == "m" and not extent else 0])[0]
        if kind == "point":  # rows picked by `rank` / a rank loop alone, as in gemm_rs.tile's `P@o[rank, m, n]`
            return Frame("point", None, None, 1, 1, 1, (), "")
        s = self.bs
        if kind == "split" and (not extent or extent % s == 0):
            nb = extent // s if extent else rng.randint(1, 3)
            if extent is None and self.R % s == 0 and rng.random() < 0.6:
                nb = self.R // s
            nbt = "R/BS" if nb * s == self.R and rng.random() < 0.7 else self.num(nb, bare=True)
            loops = (f"{scalar} in {nbt} by 1", f"{tile} in BS by {step_name}")
            return Frame("split", tile, scalar, nb, s, step, loops, f"{scalar}*BS + {tile}")
        if kind == "scalar" and e <= 24:
            return Frame("scalar", None, scalar, e, 1, 1, (f"{scalar} in {self.num(e)} by 1",), scalar)
        return Frame("tile", tile, None, 1, e, step, (f"{tile} in {self.num(e)} by {step_name}",), tile)

    def defined_rect(self, name: str) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """The rows and columns of `name` written on every rank, when they are one rectangle (else None)."""
        masks = self._st.defined[name]
        rows, cols = (torch.nonzero(masks[0].any(dim=1 - d)).flatten() for d in range(2))
        if not len(rows):
            return None
        box = ((int(rows[0]), int(rows[-1]) + 1), (int(cols[0]), int(cols[-1]) + 1))
        full = torch.zeros_like(masks[0])
        full[box[0][0]:box[0][1], box[1][0]:box[1][1]] = True
        return box if all(bool((m == full).all()) for m in masks) else None

    def idx(self, frame: Frame | None, outer: list[str], dest: bool = False, const: bool = True) -> Idx:
        """frame part + random terms in the outer vars + an offset. For a destination the rank-like terms have a
        coefficient at least the frame's extent (so tasks do not overlap), chosen by the caller via `outer`."""
        rng = self.rng
        blk = frame.total if frame else 1
        terms = []
        for v in outer:
            if dest:
                k = rng.choice([blk, blk, blk + rng.randint(1, 3)])
            else:
                k = rng.choice([1, blk, blk, blk + 1])
            terms.append((v, k, self.num(k, bare=True)))
        c = rng.choice([0, 0, 0, 0, 1, 2, 3]) if const else 0
        return Idx(frame, tuple(terms), c, frame_last=rng.random() < 0.3)

    # -- tensors --
    def new_input(self, need: tuple[int, int], peer: bool, dtype: str | None = None) -> Tensor:
        rng = self.rng
        shape = (need[0] + rng.choice([0, 0, 0, 1]), need[1] + rng.choice([0, 0, 0, 2]))
        if shape[0] * shape[1] > MAX_ELEMS:
            raise Invalid("input too large")
        name = f"X{self.n_in}"
        self.n_in += 1
        t = Tensor(name, "in", dtype or self.dtype(), shape, peer or rng.random() < 0.5)
        self.tensors[name] = t
        return t

    def dtype(self) -> str:
        """A tensor's dtype: f32, f16, bf16 (6:3:1), or with a program dtype that one, 4 times in 5."""
        x = self.rng.choices(["f32", "f16", "bf16"], [6, 3, 1])[0]
        if self.main_dtype is not None and self.rng.random() < 0.8:
            return self.main_dtype
        return x

    def need(self, a: Load, outer: list[tuple[str, int]]) -> tuple[int, int]:
        """Smallest shape that holds every element `a` reads."""
        hi = [0, 0]
        names = ["rank"] + [v for v, _ in outer]
        for vals in itertools.product(range(self.world), *(range(n) for _, n in outer)):
            env = dict(zip(names, vals, strict=True))
            for d, ix in enumerate(a.index):
                hi[d] = max(hi[d], ix.start(env) + ix.length)
        return hi[0], hi[1]

    def source(self, index: tuple[Idx, Idx], peer: str | None, outer, dtype: str | None = None) -> Load:
        """A load with this index: from a tensor already there (computed ones must be defined where read: the
        stage's validation checks) or a new input."""
        cands = [t for t in self.tensors.values() if (t.symmetric or not peer)
                 and (dtype is None or t.dtype == dtype)]
        need = self.need(Load("?", peer, index), outer)
        fits = [t for t in cands if t.shape[0] >= need[0] and t.shape[1] >= need[1]]
        computed = [t for t in fits if t.kind != "in"]
        prefer = [t for t in computed if t.name == self._prefer]
        if prefer and self.rng.random() < 0.8:  # the chain goes on from the last stage's result
            self._prefer = None
            return Load(self._prefer_name, peer, index)
        if computed and self.rng.random() < self._p_computed:
            return Load(self.rng.choice(computed).name, peer, index)
        if fits and self.rng.random() < 0.3:
            return Load(self.rng.choice(fits).name, peer, index)
        return Load(self.new_input(need, bool(peer), dtype).name, peer, index)

    # -- stages --
    def stage(self, i: int) -> Stage:
        rng = self.rng
        kind = rng.choices(["copy", "pull", "push", "math", "gemm", "rsum"], [2, 5, 3, 3, 3, 2])[0]
        self._first_gather = i == 0 and (self.focus or rng.random() < 0.4)
        if self._first_gather:  # a gather first, often: what fused-pull and fused-push transform
            kind = "push" if self.focus == "push" else "pull"
        # go on from the last result most of the time: walk its shape, read it first
        last = self.tensors[self.stages[-1].dest.tensor] if self.stages else None
        rect = self.defined_rect(last.name) if last and (rng.random() < 0.75 or self.focus) else None
        base, off = ((rect[0][1] - rect[0][0], rect[1][1] - rect[1][0]), (rect[0][0], rect[1][0])) if rect else \
            ((None, None), (0, 0))
        self._prefer = self._prefer_name = last.name if last else None
        # copies of inputs are what fused-pull fuses into their consumers
        self._p_computed = 0.3 if kind == "pull" else 0.75
        rows, cols = self.frame("m", "j", base[0]), self.frame("n", "i", base[1])
        if kind == "gemm":  # Triton's dot wants 2-d tiles on both sides: tile frames only
            rows = self.frame("m", "j", base[0] or rng.choice([self.R, self.C, rng.randint(1, 20)]), tile_only=True)
            cols = self.frame("n", "i", rng.choice([self.C, self.K, rng.randint(1, 20)]), tile_only=True)
            base = (base[0], None)
        frames = (rows, cols)
        outer = [(f.scalar, f.nb) for f in frames if f.scalar]
        loops = [lp for f in frames for lp in f.loops]
        ranked = kind in ("pull", "push") or rng.random() < 0.2
        if ranked:
            loops.insert(rng.randint(0, len(loops)), "r in ranks")
            outer.append(("r", self.world))
        names = [v for v, _ in outer]
        self._outer, self._frames, self._ktrips = outer, frames, 1
        # destination: the rank loop (and for a push, `rank`) picks a block of rows or columns
        rdim = 0 if rng.random() < 0.75 else 1
        dest_vars = [["r"] if ranked else [], []]
        if kind == "push":
            dest_vars[rdim] = ["rank"]
        elif ranked:
            dest_vars = [[], []]
            dest_vars[rdim] = ["r"]
        if kind in ("copy", "math") and rng.random() < 0.3:
            dest_vars[rdim] = dest_vars[rdim] + ["rank"]  # each rank fills its own block: a partial tensor
        didx = tuple(self.idx(frames[d], dest_vars[d], dest=True, const=rng.random() < 0.3) for d in range(2))

        def src_idx(d: int, extra: list[str], plain: bool) -> Idx:
            if plain:
                return Idx(frames[d], (), off[d] if base[d] is not None else 0)
            pool = [v for v in ["rank", *names, *extra] if v not in (frames[d].scalar,)]
            vs = [v for v in pool if rng.random() < (0.6 if v in ("r", "s", "rank") else 0.2)
                  or v == "rank" and d == 0 and self.focus and self._first_gather]
            return self.idx(frames[d], vs)

        def src(peer=None, extra=()) -> Load:
            # the last result, read where this stage's tiles are (a consumer that fused-pull can fuse into)
            plain = self._prefer is not None and (base[0] is not None or rng.random() < 0.3)
            index = (src_idx(0, list(extra), plain), src_idx(1, list(extra), plain))
            return self.source(index, peer, outer + [(v, self.world) for v in extra])

        if kind == "copy":
            value = src(peer=rng.choice([None, None, "rank"]))
        elif kind == "pull":  # focus="ring": the gather names its peer round the ring, `X@(rank + r + 1)`
            peers = {"ring": RING_PEERS, "fixed": FIXED_PEERS}.get(self.focus) if self._first_gather else None
            value = src(peer=rng.choice(peers) if peers else "r")
        elif kind == "push":
            value = src()
        elif kind == "math":
            value = self.math(src, 0, ranked)
        elif kind == "gemm":
            value = self.gemm(rows, cols, outer, ranked)
        else:
            body = src(peer="s", extra=("s",))
            if rng.random() < 0.4:
                body = Node("bin", (body, Node("const", attr=rng.choice([0.5, 2.0]))), "*")
            value = Node("rsum", (body,), "s")
        tasks = rows.trips * cols.trips * (self.world if ranked else 1) * self._ktrips
        if tasks > MAX_TASKS:
            raise Invalid(f"{tasks} tasks")
        self.kinds.add(kind)
        return self.finish(i, kind, loops, outer, didx, value)

    def math(self, src, depth: int, ranked: bool) -> Node | Load:
        rng = self.rng
        if depth >= 2 or rng.random() < 0.3:
            return src(peer="r" if ranked and rng.random() < 0.4 else None)
        x = self.math(src, depth + 1, ranked)
        pick = rng.randrange(12)
        if pick == 0:
            return Node("fn", (x,), rng.choice(["relu", "sigmoid", "tanh", "abs", "silu"]))
        if pick == 1:
            return Node("fn", (Node("fn", (x,), "tanh"),), "exp")
        if pick == 2:  # log and sqrt of something positive
            pos = Node("bin", (Node("fn", (x,), "abs"), Node("const", attr=1.0)), "+")
            return Node("fn", (pos,), rng.choice(["log", "sqrt"]))
        if pick == 3:
            return Node("fn", (x, self.math(src, depth + 1, ranked)), rng.choice(["max", "min"]))
        if pick == 4:
            den = Node("bin", (Node("fn", (self.math(src, depth + 1, ranked),), "abs"), Node("const", attr=1.0)), "+")
            return Node("bin", (x, den), "/")
        if pick == 5:
            return Node("bin", (x, Node("var", attr="rank")), "*")
        if pick == 6:  # a [1, N] row broadcast over the tile's rows
            cols = self._frames[1]  # a [1, N] vector: one row, the columns of the tile
            col = self.idx(cols, [v for v, _ in self._outer if v != cols.scalar and rng.random() < 0.2])
            row = Idx(None, (), rng.choice([0, 0, 1]))
            return Node("bin", (x, self.source((row, col), None, self._outer)), "+")
        op = rng.choice(["+", "-", "*"])
        y = self.math(src, depth + 1, ranked) if rng.random() < 0.6 else Node("const", attr=rng.choice([0.5, 1.5, 3.0]))
        return Node("bin", (x, y), op)

    def gemm(self, rows: Frame, cols: Frame, outer, ranked: bool) -> Node:
        rng = self.rng
        kf = self.frame("k", "", rng.choice([self.K, self.C, rng.randint(1, 24)]), tile_only=True)
        names = [v for v, _ in outer]
        dt = self.dtype()
        peer = "r" if ranked and rng.random() < 0.5 else None
        a_rows = self.idx(rows, [v for v in ["rank", *names] if rng.random() < 0.3])
        a = self.source((a_rows, self.idx(kf, [], const=rng.random() < 0.3)), peer, outer, dt)
        b = self.source((self.idx(kf, [], const=rng.random() < 0.3), self.idx(cols, [])), None, outer,
                        dt if rng.random() < 0.8 else None)
        mixed = self.tensors[a.tensor].dtype != self.tensors[b.tensor].dtype
        g = Node("gemm", (a, b), (kf.loops[0], mixed))
        self._ktrips = kf.trips
        if rng.random() < 0.4:
            g = Node("fn", (g,), rng.choice(["relu", "tanh", "sigmoid"]))
        if self.sibling_rng.random() < 0.3:  # silu(a @ b) * (a @ b2), or a sum or difference of the two
            b2 = self.source((self.idx(kf, [], const=self.sibling_rng.random() < 0.3), self.idx(cols, [])), None,
                             outer, dt if self.sibling_rng.random() < 0.8 else None)
            mixed2 = self.tensors[a.tensor].dtype != self.tensors[b2.tensor].dtype
            op = self.sibling_rng.choice(["*", "+", "-"])
            first = Node("fn", (g,), "silu") if op == "*" else g
            g = Node("bin", (first, Node("gemm", (a, b2), (kf.loops[0], mixed2))), op)
        return g

    def finish(self, i: int, kind: str, loops, outer, didx, value) -> Stage:
        rng = self.rng
        name = f"T{i}"
        peer = "r" if kind == "push" else None
        need = self.need(Load("?", peer, didx), outer)
        shape = (need[0] + rng.choice([0, 0, 0, 1]), need[1])
        sym = kind == "push" or rng.random() < 0.6
        if shape[0] * shape[1] > MAX_ELEMS:
            raise Invalid(f"{name} too large")
        p_buf = 1.0 if self.focus and i == 0 else 0.9 if kind == "pull" else 0.7
        t = Tensor(name, "buf" if rng.random() < p_buf else "out", self.dtype(), shape, sym)
        self.tensors[name] = t
        return Stage(f"s{i}", loops, outer, Load(name, peer, didx), value)

    def program(self, n_stages: int) -> GenProgram:
        st = self._st = _State(self.world, self.tensors)  # grows with the tensors: masks only matter here
        while len(self.stages) < n_stages:
            snapshot = dict(self.tensors), self.n_in, set(self.kinds)
            try:
                s = self.stage(len(self.stages))
                st.tensors = self.tensors
                for n, t in self.tensors.items():
                    if n not in st.defined:
                        st.defined[n] = [torch.full(t.shape, t.kind == "in") for _ in range(self.world)]
                        st.vals[n] = [torch.zeros(t.shape) for _ in range(self.world)]
                st.run(s)
            except Invalid:
                self.tensors, self.n_in, self.kinds = snapshot
                for n in list(st.defined):
                    if n not in self.tensors:
                        del st.defined[n], st.vals[n]
                continue
            self.stages.append(s)
        last = self.stages[-1].dest.tensor
        self.tensors[last].kind = "out"
        self.barriers()
        return self.render()

    def barriers(self) -> None:
        """A barrier after every stage but where the next one reads nothing of this phase remotely and nothing
        pushed in it (then it is legal to leave out; kept mostly)."""
        phase_local: set[str] = set()
        phase_remote: set[str] = set()
        for s, nxt in zip(self.stages, self.stages[1:], strict=False):
            (phase_remote if s.dest.peer else phase_local).add(s.dest.tensor)
            reads = list(_loads(nxt.value))
            bad = any(ld.tensor in phase_remote or (ld.tensor in phase_local and ld.peer not in (None, "rank"))
                      for ld in reads)
            s.barrier = bad or self.rng.random() < 0.75
            if s.barrier:
                phase_local, phase_remote = set(), set()

    def render(self) -> GenProgram:
        rng = self.rng
        dt = f"_{self.main_dtype}" if self.main_dtype else ""  # another program than the plain seed's
        tag = {"push": "p", True: "f", "ring": "r", "fixed": "x"}.get(self.focus, "")
        name = f"gen_{self.seed}{tag}{dt}_w{self.world}"
        lines = [f"# generated by tests/gen_programs.py: seed {self.seed}, world {self.world}"
                 + {"push": ", focus push", True: ", focus", "ring": ", focus ring", "fixed": ", focus fixed"}.get(
                     self.focus, "")
                 + (f", dtype {self.main_dtype}" if self.main_dtype else ""),
                 f"program {name}(world W)",
                 f"  dims R = {self.R}, C = {self.C}, K = {self.K}, M = {self.R * self.world}",
                 "  tiles " + ", ".join(f"{k} = {v}" for k, v in self.tile_vals.items())]
        order = sorted(self.tensors.values(), key=lambda t: (t.kind != "in", t.name))
        for t in order:
            sym = " symmetric" if t.symmetric else ""
            lines.append(f"  {t.kind:<3} {t.name} : {t.dtype}[{self.num(t.shape[0])}, {self.num(t.shape[1])}]{sym}")
        body = ""
        for s in self.stages:
            body += s.text() + ("  barrier\n" if s.barrier and s is not self.stages[-1] else "")
        text = "\n".join(lines) + "\n\n" + body
        plain = tuple(t.name for t in self.tensors.values() if t.kind == "in" and not t.symmetric
                      and rng.random() < 0.5)
        return GenProgram(name, self.world, self.seed, text, dict(self.tensors), list(self.stages), plain,
                          set(self.kinds))


def _loads(e):
    if isinstance(e, Load):
        yield e
    elif isinstance(e, Node):
        for a in e.args:
            yield from _loads(a)


def generate(seed: int, world: int, stages: int | None = None, focus: bool | str = False,
             dtype: str | None = None) -> GenProgram:
    """The program of `seed` for `world` ranks (1-4 stages unless `stages` says how many). `focus`: 2-3 stages,
    the first a gather of an input into a buffer with `rank` in its source index (an all-to-all), read by the next
    (the class fused-pull once got wrong); focus="push": the same with the first stage a push of an input into
    the peers (`T@r[... rank ...] = X[...]`: what a copy engine then pushes); focus="ring": the gather's peer an
    expression round the ring (`X@(rank + r + 1)[...]`, RING_PEERS); focus="fixed": a fixed rank (`X@(1)[...]`,
    FIXED_PEERS). `dtype`: most tensors of that
    dtype (else f32, f16 and bf16 drawn 6:3:1 per tensor); a program's name says which."""
    g = _Gen(seed, world, focus, dtype)
    return g.program(stages or g.rng.choice([2, 3] if focus else [1, 2, 2, 3, 3, 4]))


# -- option combinations ------------------------------------------------------------------------------------------

# what a generated program is compiled with: every run draws one value of each (tests/test_generated_programs.py)
OPTIONS: dict[str, tuple] = {
    "schedule": ("bsp", "flags", "fused-pull", "fused-push", "specialized"),
    "transport": ("sm", "dma"),
    "granularity": ("auto", "tile", "rank", "tensor"),
    "start_local": (False, True),
    "group_m": (1, 2, 8),
    "world": (1, 2, 3, 4),
    "dtype": ("f32", "f16", "bf16"),
}
# transport=dma needs flags and a copy stage left by the schedule: bsp has barriers, fused-pull folds every copy
# into its consumer (both refuse it with a ScheduleError, checked on their own)
DMA_SCHEDULES = ("flags", "fused-push", "specialized")
# options whose values meet in the flags a schedule makes and a transport sets: covered three at a time
TRIPLES = (("schedule", "transport", "granularity"), ("transport", "granularity", "world"))


@dataclass(frozen=True)
class Combo:
    schedule: str
    transport: str
    granularity: str
    start_local: bool
    group_m: int
    world: int
    dtype: str

    @property
    def label(self) -> str:
        return (f"{self.schedule}+{self.transport} {self.granularity} start_local={self.start_local} "
                f"group_m={self.group_m} w{self.world} {self.dtype}")


def valid_combos() -> list[Combo]:
    """Every combination of OPTIONS a schedule can take (dma only with DMA_SCHEDULES), in a fixed order."""
    out = [Combo(*vals) for vals in itertools.product(*OPTIONS.values())]
    return [c for c in out if c.transport == "sm" or c.schedule in DMA_SCHEDULES]


def interactions(c: Combo, triples=TRIPLES) -> frozenset:
    """The value pairs of every two options of `c`, and the value triples of the options in `triples`."""
    names = list(OPTIONS)
    vals = {n: getattr(c, n) for n in names}
    out = {((a, vals[a]), (b, vals[b])) for a, b in itertools.combinations(names, 2)}
    out |= {tuple((n, vals[n]) for n in t) for t in triples}
    return frozenset(out)


def covering(feasible, combos: list[Combo] | None = None, triples=TRIPLES) -> tuple[list, set]:
    """A covering array, greedily: rows of combos that between them hold every pair of option values (and every
    triple of `triples`) that some valid combo holds. `feasible(combo, i)` gives the row's payload (a program it
    compiles, for row number i) or None (the combo is dropped, another one covers what it would have). Returns
    ([(combo, payload)], the interactions no feasible combo covered)."""
    combos = valid_combos() if combos is None else combos
    keys = {c: interactions(c, triples) for c in combos}
    todo = set().union(*keys.values())
    rows, dropped, used = [], set(), {}
    while todo:
        best, score = None, (0, 0)
        for c in combos:  # the most new interactions; of those, the values the rows hold least (deterministic)
            if c not in dropped:
                n = len(keys[c] & todo)
                if n and (n, -sum(used.get((k, getattr(c, k)), 0) for k in OPTIONS)) > score:
                    best, score = c, (n, -sum(used.get((k, getattr(c, k)), 0) for k in OPTIONS))
        if best is None:
            break
        payload = feasible(best, len(rows))
        if payload is None:
            dropped.add(best)
            continue
        rows.append((best, payload))
        todo -= keys[best]
        for k in OPTIONS:
            used[k, getattr(best, k)] = used.get((k, getattr(best, k)), 0) + 1
    return rows, todo
