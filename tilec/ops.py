"""tilec programs as PyTorch operators: `tilec.op(program)` registers `tilec::<name>`, a `torch.library.custom_op`.

The op takes the program's `in` tensors (in declaration order) and returns its `out` tensors (one tensor, or a tuple).
Dims given in `dims=` are fixed; every other dim follows the inputs' shapes (`M` from `A: f16[M/W, K]` is
`A.shape[0] * W`); a dim no input determines must be given in `dims=` (its default in the .tile is an example).
Each distinct set of bound dims (and world) compiles one variant, cached on the op, so a new batch size just works.
A fake kernel computes the outputs' shapes from the declarations, so `torch.compile(fullgraph=True)` traces through it.

Symmetric inputs must live on the symmetric heap at the same offset on every rank: a tensor from `tilec.empty` (made
on every rank in the same order) is passed as is; any other is copied into a staging buffer on the heap. Staging
buffers of every op on a heap come from one pool keyed by dtype and shape, so ops that never run at the same time
share them. Every op call is a collective: all ranks call the same ops in the same order.

`op(inputs..., out=C)` (a tuple for several outputs) is `tilec::<name>.out`, which writes the caller's tensors: a heap
tensor, or for an output that is not symmetric any contiguous tensor on the heap's device, is written in place; any
other through a copy.

Errors: on a GPU a call returns once its kernels are queued. A wait in it that times out (a rank that never made the
call) is raised as WaitTimeout by a later call of the op once the GPU has got that far, or at once by
`op.check_errors()`; on the CPU emulation by the call itself.

CUDA graphs: an op's call count (the epoch its flags count in) lives on the device, so a call recorded by
torch.cuda.graph or torch.compile(mode="reduce-overhead") replays as a call of its own. While a graph is being
captured a call's entry and exit barriers are device kernels (tilec.device.barrier) instead of host barriers;
barrier="device" uses them in every call. A shape must have been called once before it is captured (its first call
allocates and zeroes heap buffers), and only schedules without host barriers between kernels (CAPTURABLE) capture.
"""

from __future__ import annotations

import hashlib
import math
import operator
import os
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import torch

from tilec.errors import ArgumentError, ScheduleError
from tilec.frontend import ast
from tilec.frontend.affine import NotAffine, affine, concrete, is_zero, norm
from tilec.frontend.parser import parse
from tilec.reference import TORCH_DTYPE
from tilec.runtime import active_heap
from tilec.runtime.errors import HeapError
from tilec.runtime.heap import ALIGN, _align

# schedules tried in this order when none is named: one persistent kernel first (no host barrier inside a call)
SCHEDULE_PREFERENCE = ("fused-push", "specialized", "flags", "bsp")
CAPTURABLE = ("fused-push", "specialized", "flags")  # schedules whose calls a CUDA graph can hold
# barrier= of tilec.op: "auto": a call's entry / exit barriers are host barriers, device kernels (tilec.device.barrier)
# while a CUDA graph is being captured; "device": device kernels always (no host round trip in any call).
BARRIERS = ("auto", "device")

_OPS: dict[str, TileOp] = {}  # registered op name -> its TileOp (torch.library names are process-wide)


def empty(shape, dtype: torch.dtype = torch.float32, *, heap=None) -> torch.Tensor:
    """An uninitialized tensor on the symmetric heap (the active one by default): pass it to a tilec op as a
    symmetric input and the op uses it in place. Collective like every heap allocation: every rank allocates the
    same shapes in the same order. Heap memory is only given back by `heap.release(mark)`, so keep such tensors
    for the model's lifetime rather than making new ones every step."""
    if not isinstance(dtype, torch.dtype):
        raise ArgumentError(f"tilec.empty: dtype={dtype!r} is not a torch.dtype")
    if isinstance(shape, int | torch.SymInt):
        shape = (shape,)
    try:
        dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise ArgumentError(f"tilec.empty: shape={shape!r} must be a sequence of ints") from None
    if any(d < 0 for d in dims):
        raise ArgumentError(f"tilec.empty: shape={list(dims)} has a negative size")
    return (heap or active_heap()).alloc(dims, dtype, zero=False)


def op(program: str | os.PathLike | None = None, *, source: str | None = None, name: str | None = None,
       dims: Mapping[str, int] | None = None, schedule: str | None = None, world: int | None = None,
       retype: Mapping[str, str] | None = None, barrier: str = "auto", **compile_kw) -> TileOp:
    """The PyTorch operator `tilec::<name>` of a .tile program (a path, or `source=` text).

    dims: fixed dims and tile sizes; the other dims follow the inputs' shapes. schedule: a named schedule, or the
    first of SCHEDULE_PREFERENCE that applies. world: fixed world size (default: the active heap's, at each call).
    retype: e.g. {"f16": "bf16"}. barrier: the calls' entry barrier, "auto" (a host barrier; a device kernel under
    CUDA graph capture) or "device" (the kernel always). Other keyword arguments go to tilec.compile (num_warps,
    wait_timeout, ...).
    The same name asked for again with the same settings returns the same op; with others, an ArgumentError."""
    if source is None:
        if program is None:
            raise ArgumentError("tilec.op: give a .tile path or source=")
        path = Path(program)
        try:
            source = path.read_text()
        except OSError as e:
            raise ArgumentError(f"tilec.op: cannot read {str(path)!r}: {e.strerror or e}") from None
        file = str(program)
    else:
        if not isinstance(source, str):
            raise ArgumentError(f"tilec.op: source= must be the program text, got {type(source).__name__}")
        file = str(program) if program is not None else "<string>"
    tree = parse(source, file)
    name = tree.name if name is None else name
    if not isinstance(name, str) or not name.isidentifier():
        raise ArgumentError(f"tilec.op: name={name!r} must be a Python identifier (it becomes tilec::<name>)")
    if schedule is not None and not isinstance(schedule, str):
        raise ArgumentError(f"tilec.op: schedule={schedule!r} must be a schedule name")
    if world is not None:
        world = _positive_int(world, "world")
    fixed = _check_dims(dims, tree)
    if barrier not in BARRIERS:
        raise ArgumentError(f"tilec.op: barrier={barrier!r}: expected one of {', '.join(BARRIERS)}")
    settings = (source, tuple(sorted(fixed.items())), schedule, world, tuple(sorted((retype or {}).items())),
                tuple(sorted(compile_kw.items())), barrier)
    known = _OPS.get(name)
    if known is not None:
        if known.settings == settings:
            return known
        raise ArgumentError(f"tilec.op: tilec::{name} is already registered with other settings (program, dims, "
                            "schedule, world or retype); give this one another name=")
    made = TileOp(tree, file, name, fixed, schedule, world, dict(retype or {}), compile_kw, settings, barrier)
    _OPS[name] = made
    return made


def _positive_int(v, what: str) -> int:
    try:
        if isinstance(v, bool):  # an int to Python, never meant as a size
            raise TypeError
        v = operator.index(v)  # numpy integers are fine
    except TypeError:
        raise ArgumentError(f"{what} = {v!r}: must be an int, got {type(v).__name__}") from None
    if v < 1:
        raise ArgumentError(f"{what} = {v}: must be >= 1")
    return v


def _check_dims(dims, tree: ast.Program) -> dict[str, int]:
    """dims= as the program can take it: known names, positive ints (a clear error naming the dim otherwise)."""
    if dims is None:
        return {}
    if not isinstance(dims, Mapping):
        raise ArgumentError(f"dims={dims!r}: must be a dict of name -> int")
    names = [d.name for d in tree.dims] + [t.name for t in tree.tiles]
    out = {}
    for k, v in dims.items():
        if k not in names:
            raise ArgumentError(f"dims: {tree.name} has no dim or tile size named {k!r}; it has {', '.join(names)}")
        out[k] = _positive_int(v, f"dims[{k!r}]")
    return out


# -- sizes: declared shapes as functions of the dims -------------------------------------------------------------

Num = int | Fraction | torch.SymInt


def _affine(e: ast.Expr, env: Mapping[str, Num], unknown: str | None) -> tuple[Num, Num]:
    """e = coef * unknown + const, with the other names' values from env."""
    terms, const = affine(e, env, () if unknown is None else (unknown,))
    return terms.get(unknown, 0), const


def _names(e: ast.Expr) -> set[str]:
    if isinstance(e, ast.Name):
        return {e.id}
    if isinstance(e, ast.BinOp):
        return _names(e.lhs) | _names(e.rhs)
    if isinstance(e, ast.Neg):
        return _names(e.operand)
    return set()


def _size(e: ast.Expr, env: Mapping[str, Num]) -> Num:
    return _affine(e, env, None)[1]


@dataclass(frozen=True)
class _Arg:
    name: str
    dtype: str
    shape: tuple[ast.Expr, ...]
    symmetric: bool


# -- the op ------------------------------------------------------------------------------------------------------


class TileOp:
    """One .tile program as `torch.ops.tilec.<name>`; call it like a function of the program's inputs."""

    def __init__(self, tree: ast.Program, file: str, name: str, fixed: dict[str, int], schedule: str | None,
                 world: int | None, retype: dict[str, str], compile_kw: dict, settings: tuple, barrier: str = "auto"):
        self.tree, self.file, self.name, self.fixed, self.barrier = tree, file, name, fixed, barrier
        self.schedule, self.world, self.retype, self.compile_kw, self.settings = (schedule, world, retype,
                                                                                   compile_kw, settings)
        self.inputs = [_Arg(t.name, retype.get(t.dtype, t.dtype), t.shape, t.symmetric)
                       for t in tree.tensors if t.kind == "in"]
        self.outputs = [_Arg(t.name, retype.get(t.dtype, t.dtype), t.shape, t.symmetric)
                        for t in tree.tensors if t.kind == "out"]
        if not self.outputs:
            raise ArgumentError(f"tilec.op: {tree.name} declares no out tensor; an op must return something")
        self.follows = self._followed_dims()
        self.variants: dict[tuple, object] = {}  # (world, dims) -> CompiledProgram
        self.stats = {"calls": 0, "copies": 0, "compiles": 0}
        self.last_args: dict[str, int] = {}  # argument name -> data_ptr of what the program ran on, last call
        # the trailing `variant` string ("w<world>:<digest of the op's settings>") is a constant of every traced
        # graph: the outputs' shapes depend on the world and the program, and Inductor's on-disk graph caches key on
        # the graph, so without it a world-1 compile of the same model was reused at world 2 (and failed its checks)
        self.digest = hashlib.sha1(repr(settings).encode()).hexdigest()[:12]
        schema = "(" + ", ".join([*(f"Tensor {a.name}" for a in self.inputs), "str variant"]) + ") -> "
        schema += "Tensor" if len(self.outputs) == 1 else "(" + ", ".join("Tensor" for _ in self.outputs) + ")"
        self.qualname = f"tilec::{name}"
        self.custom_op = torch.library.custom_op(self.qualname, self._run, mutates_args=(), schema=schema)
        self.custom_op.register_fake(self._fake)
        # tilec::<name>.out(inputs..., outputs...) -> (): writes the caller's output tensors (op(..., out=...))
        outs = ", ".join(f"Tensor({chr(ord('a') + i)}!) {o.name}" for i, o in enumerate(self.outputs))
        out_schema = "(" + ", ".join([*(f"Tensor {a.name}" for a in self.inputs), outs, "str variant"]) + ") -> ()"
        self.out_op = torch.library.custom_op(self.qualname + ".out", self._run_out,
                                              mutates_args=tuple(o.name for o in self.outputs), schema=out_schema)
        self.out_op.register_fake(self._fake_out)

        def variant_tag(op=self) -> str:
            """The `variant` argument of this op's calls now: "w<world>:<digest of the program and settings>"."""
            return f"w{op._world()}:{op.digest}"

        # traced as the constant it returns (no symbolic world under dynamic=True); made here, not at import: the
        # decorator imports torch._dynamo (and Triton), which `import tilec` must not
        self.variant_tag = torch.compiler.assume_constant_result(variant_tag)

    def __repr__(self) -> str:
        dims = ", ".join(f"{k}={v}" for k, v in self.fixed.items())
        return (f"<tilec op {self.qualname}({', '.join(a.name for a in self.inputs)}) follows "
                f"[{', '.join(self.follows)}] fixed [{dims}], {len(self.variants)} variant(s)>")

    def __call__(self, *args, out=None, **kwargs):
        """op(inputs...) returns new output tensors; op(inputs..., out=C) (a tuple for several outputs) writes into
        the caller's tensors and returns them: a heap tensor (tilec.empty) or, for an output that is not symmetric,
        any contiguous tensor on the heap's device is written in place; any other is written through a copy."""
        inputs = self._positional(args, kwargs)
        variant = self.variant_tag()
        if out is None:
            return self.custom_op(*inputs, variant)
        outs = (out,) if isinstance(out, torch.Tensor) else out
        if not isinstance(outs, tuple | list) or len(outs) != len(self.outputs) or not all(
                isinstance(t, torch.Tensor) for t in outs):
            names = ", ".join(o.name for o in self.outputs)
            raise ArgumentError(f"{self.qualname}: out= takes {len(self.outputs)} tensor(s) ({names}), got "
                                f"{out!r:.80}")
        self.out_op(*inputs, *outs, variant)
        return out

    def _positional(self, args: tuple, kwargs: dict) -> list:
        names = [a.name for a in self.inputs]
        if len(args) > len(names):
            raise ArgumentError(f"{self.qualname}: takes {len(names)} inputs ({', '.join(names)}), got {len(args)}")
        vals = dict(zip(names, args, strict=False))
        for k, v in kwargs.items():
            if k not in names:
                raise ArgumentError(f"{self.qualname}: unexpected argument {k!r}; it takes {', '.join(names)}")
            if k in vals:
                raise ArgumentError(f"{self.qualname}: argument {k!r} given twice")
            vals[k] = v
        missing = [n for n in names if n not in vals]
        if missing:
            raise ArgumentError(f"{self.qualname}: missing input(s) {', '.join(missing)}")
        for a in self.inputs:
            t = vals[a.name]
            if not isinstance(t, torch.Tensor):
                raise ArgumentError(f"{self.qualname}: input {a.name!r} must be a torch.Tensor, got "
                                    f"{type(t).__name__}")
            if t.dtype != TORCH_DTYPE[a.dtype]:
                raise ArgumentError(f"{self.qualname}: input {a.name!r} has dtype "
                                    f"{str(t.dtype).removeprefix('torch.')}, the program declares {a.dtype}")
            if t.dim() != len(a.shape):
                raise ArgumentError(f"{self.qualname}: input {a.name!r} has {t.dim()} dims, the program declares "
                                    f"{len(a.shape)}")
        return [vals[n] for n in names]

    # -- dims ----------------------------------------------------------------------------------------------------

    def _consts(self, world) -> dict[str, Num]:
        env: dict[str, Num] = {self.tree.world: world}
        env.update({t.name: t.value for t in self.tree.tiles})
        env.update(self.fixed)
        return env

    def _followed_dims(self) -> list[str]:
        """Dims an input's shape determines (with any world), in the order they are solved. A dim that none does
        must be fixed in dims=, an error now rather than at the first call: its default in the .tile is an example
        value, and a call that silently took it (flash decode's positions per rank S, which no tensor's shape holds)
        would compute something else than the caller's inputs mean."""
        env = dict.fromkeys([self.tree.world, *(t.name for t in self.tree.tiles), *self.fixed], 1)
        order = self._solve_order(env)
        for d in self.tree.dims:
            if d.name not in self.fixed and d.name not in order:
                why = ("has no default and no input's shape determines it" if d.default is None else
                       f"(default {d.default}, an example value): no input's shape determines it")
                raise ArgumentError(f"tilec.op: dim {d.name!r} of {self.tree.name} {why}: give it in dims=")
        return order

    def _solve_order(self, env: dict) -> list[str]:
        free = {d.name for d in self.tree.dims} - set(self.fixed)
        order: list[str] = []
        progress = True
        while progress:
            progress = False
            for a in self.inputs:
                for e in a.shape:
                    left = (_names(e) & free) - set(order)
                    if len(left) == 1 and _names(e) <= set(env) | free:
                        d = left.pop()
                        try:
                            coef, _ = _affine(e, {**env, **dict.fromkeys(order, 1)}, d)
                        except NotAffine:
                            continue
                        if not is_zero(coef):
                            order.append(d)
                            progress = True
        return order

    def bind(self, tensors: Sequence[torch.Tensor], world) -> dict[str, Num]:
        """The dims of a call: fixed ones, those the inputs' shapes give, defaults for the rest. Concrete sizes are
        checked (a whole number >= 1, and every input's shape as declared); symbolic ones (torch.compile with
        dynamic shapes) are solved alike and left to the runtime check."""
        env = self._consts(world)
        shapes = {a.name: tuple(t.shape) for a, t in zip(self.inputs, tensors, strict=True)}
        for d in self.follows:
            a, axis, e = self._source_of(d, env)
            coef, const = _affine(e, env, d)
            size = shapes[a.name][axis]
            if concrete(size) and concrete(coef) and concrete(const):
                v = (Fraction(size) - Fraction(const)) / Fraction(coef)
                if v.denominator != 1 or v < 1:
                    raise ArgumentError(f"{self.qualname}: input {a.name!r} has size {size} along axis {axis}, which"
                                        f" gives {d} = {v} (world {world}); {d} must be a whole number >= 1")
                env[d] = int(v)
            else:
                env[d] = _solve_symbolic(size, coef, const)
        for d in self.tree.dims:
            if d.name not in env:
                env[d.name] = d.default
        self._check_whole(env, world)
        for a in self.inputs:
            want = tuple(_size(e, env) for e in a.shape)
            got = shapes[a.name]
            for w, g in zip(want, got, strict=True):
                if concrete(w) and concrete(g):
                    if w != g:
                        bound = ", ".join(f"{d.name}={env[d.name]}" for d in self.tree.dims)
                        raise ArgumentError(f"{self.qualname}: input {a.name!r} has shape {list(got)}, the program "
                                            f"declares {list(want)} (world {world}, {bound})")
                else:
                    torch._check(g == w, lambda a=a: f"{self.qualname}: input {a.name!r} shape")
        return {d.name: env[d.name] for d in self.tree.dims}

    def _check_whole(self, env: Mapping[str, Num], world) -> None:
        """Every declared size (outputs and internal buffers too) must be a whole number >= 1 under these dims."""
        for t in self.tree.tensors:
            for axis, e in enumerate(t.shape):
                v = _size(e, env)
                if concrete(v) and (Fraction(v).denominator != 1 or v < 1):
                    bound = ", ".join(f"{d.name}={env[d.name]}" for d in self.tree.dims)
                    raise ArgumentError(f"{self.qualname}: with {bound} (world {world}, from the inputs' shapes) "
                                        f"{t.kind} {t.name!r} would have size {v} along axis {axis}; sizes must "
                                        "be whole numbers >= 1")

    def _source_of(self, d: str, env: Mapping) -> tuple[_Arg, int, ast.Expr]:
        for a in self.inputs:
            for axis, e in enumerate(a.shape):
                if d in _names(e) and _names(e) - {d} <= set(env):
                    try:
                        coef, _ = _affine(e, env, d)
                    except NotAffine:
                        continue
                    if not is_zero(coef):
                        return a, axis, e
        raise AssertionError(f"dim {d} has no source")  # _followed_dims found one with the same rules

    def out_shapes(self, dims: Mapping[str, Num], world) -> list[tuple]:
        env = {**self._consts(world), **dims}
        return [tuple(norm(_size(e, env)) for e in o.shape) for o in self.outputs]

    def _world(self, heap=None) -> int:
        if self.world is not None:
            return self.world
        return (heap or active_heap()).world

    # -- variants ------------------------------------------------------------------------------------------------

    def variant(self, world: int, dims: Mapping[str, int]):
        """The compiled program for these dims (compiled once per op and process)."""
        key = (world, tuple(sorted(dims.items())))
        prog = self.variants.get(key)
        if prog is None:
            prog = self._compile(world, {**dims, **{t.name: v for t, v in self._tiles()}})
            self.variants[key] = prog
            self.stats["compiles"] += 1
        return prog

    def _tiles(self):
        return [(t, self.fixed.get(t.name, t.value)) for t in self.tree.tiles]

    def _compile(self, world: int, dims: dict):
        from tilec.api import compile as tilec_compile

        names = [self.schedule] if self.schedule else list(SCHEDULE_PREFERENCE)
        reasons = []
        for s in names:
            try:
                return tilec_compile(self.file, world=world, schedule=s, dims=dims, source=self.tree.source,
                                     retype=self.retype or None, **self.compile_kw)
            except ScheduleError as e:
                if self.schedule:
                    raise
                reasons.append(f"{s}: {e}")
        raise ScheduleError(f"{self.qualname}: no schedule applies: " + "; ".join(reasons))

    def check_errors(self, heap=None) -> None:
        """Wait for this op's queued calls on the heap (the active one by default) and raise WaitTimeout if a wait
        in one of them timed out. On a GPU calls do not wait for their kernels, so a timeout is otherwise raised
        by a later call of the op once the GPU has got that far."""
        heap = heap or active_heap()
        for v in self.variants.values():
            v.raise_recorded(heap, wait=True)

    def heap_bytes(self, world: int | None = None, **shapes) -> int:
        """Symmetric-heap bytes one variant needs (its buffers, flags and staging), for sizing a heap before it
        exists: `op.heap_bytes(2, A=(128, 64), B=(64, 96))` (input shapes) or with dims: `op.heap_bytes(2, M=256)`."""
        world = _positive_int(world if world is not None else self._world(), "world")
        names = {a.name for a in self.inputs}
        if shapes and set(shapes) <= names and len(shapes) == len(names):
            dims = self.bind([torch.empty(s, device="meta") for s in (shapes[a.name] for a in self.inputs)], world)
        else:
            env = self._consts(world)
            for d in self.tree.dims:
                if d.name in shapes:
                    env[d.name] = _positive_int(shapes.pop(d.name), f"dims[{d.name!r}]")
                elif d.name not in env:
                    env[d.name] = d.default
            if shapes:
                raise ArgumentError(f"{self.qualname}.heap_bytes: unknown {', '.join(shapes)}: give every input's "
                                    "shape, or dims by name")
            if any(v is None for v in env.values()):
                raise ArgumentError(f"{self.qualname}.heap_bytes: give the dims without a default")
            dims = {d.name: env[d.name] for d in self.tree.dims}
        return _program_bytes(self.variant(world, dims)) + sum(nbytes for _k, nbytes in self._staging(
            self.variant(world, dims)))

    def _staging(self, prog) -> list[tuple[tuple, int]]:
        """(pool key, bytes) of the heap buffers a call of `prog` may copy symmetric inputs / outputs through."""
        out, seen = [], {}
        for _kind, dtype, shape, sym in prog.signature().values():
            if sym:  # two arguments of one dtype and shape get two buffers
                k = (dtype, tuple(shape))
                seen[k] = seen.get(k, 0) + 1
                out.append(((*k, seen[k] - 1), _align(math.prod(shape) * TORCH_DTYPE[dtype].itemsize)))
        return out

    # -- calls ---------------------------------------------------------------------------------------------------

    @staticmethod
    def _variant_world(variant: str) -> int:
        return int(variant.split(":", 1)[0][1:])

    def _fake(self, *args):
        tensors, world = args[:-1], self._variant_world(args[-1])
        dims = self.bind(tensors, world)
        like = tensors[0]
        outs = [like.new_empty(s, dtype=TORCH_DTYPE[o.dtype])
                for s, o in zip(self.out_shapes(dims, world), self.outputs, strict=True)]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _fake_out(self, *args):
        n = len(self.inputs)
        args, world = args[:-1], self._variant_world(args[-1])
        self._check_outs(args[n:], self.out_shapes(self.bind(args[:n], world), world))

    def _check_outs(self, outs, shapes) -> None:
        for o, t, s in zip(self.outputs, outs, shapes, strict=True):
            if t.dtype != TORCH_DTYPE[o.dtype]:
                raise ArgumentError(f"{self.qualname}: out {o.name!r} has dtype "
                                    f"{str(t.dtype).removeprefix('torch.')}, the program declares {o.dtype}")
            if len(t.shape) != len(s) or not all(not (concrete(g) and concrete(w)) or g == w
                                                 for g, w in zip(t.shape, s, strict=True)):
                raise ArgumentError(f"{self.qualname}: out {o.name!r} has shape {list(t.shape)}, the program "
                                    f"declares {list(s)} for these inputs")

    def _run_out(self, *args) -> None:
        n = len(self.inputs)
        self._run_into(args[:n], args[n:-1], self._variant_world(args[-1]))

    def _run(self, *args):
        return self._run_into(args[:-1], None, self._variant_world(args[-1]))

    def _run_into(self, tensors, outs, world: int):
        """One call; outs: the caller's output tensors (written, nothing returned), or None (new outputs returned);
        world: the one the caller's graph was traced for."""
        heap = active_heap()
        if world != heap.world:
            raise ArgumentError(f"{self.qualname}: called for world {world}, the active heap has {heap.world} ranks")
        capturing = heap.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        dims = self.bind(tensors, world)
        prog = self.variant(world, dims)
        for v in self.variants.values():  # a wait of an earlier call that timed out, seen without waiting for it
            v.raise_recorded(heap)
        if capturing:
            self._check_capturable(prog, heap, dims)
        pool = _pool(heap)
        staging = self._staged(prog, heap, pool)
        args, copies = {}, 0
        for a, t in zip(self.inputs, tensors, strict=True):
            if a.symmetric and not (heap.owns(t) and t.is_contiguous()):
                args[a.name] = staging[a.name].copy_(t)
                copies += 1
            elif not a.symmetric and (t.device != heap.device or not t.is_contiguous()):
                args[a.name] = t.to(heap.device).contiguous()
            else:
                args[a.name] = t
        shapes = self.out_shapes(dims, world)
        if outs is not None:
            from tilec.program import _same_device

            self._check_outs(outs, shapes)
        for i, (o, s) in enumerate(zip(self.outputs, shapes, strict=True)):
            t = outs[i] if outs is not None else None
            if t is not None and t.is_contiguous() and (heap.owns(t) if o.symmetric else
                                                        _same_device(t.device, heap.device)):
                args[o.name] = t  # the caller's tensor, written in place
            else:
                args[o.name] = staging[o.name] if o.symmetric else torch.empty(s, dtype=TORCH_DTYPE[o.dtype],
                                                                               device=heap.device)
        self.last_args = {n: t.data_ptr() for n, t in args.items()}
        # the epoch lives on the device, so calls a graph recorded replay as calls of their own
        prog(heap, sync=heap.interpret, device_epoch=True, device_barrier=capturing or self.barrier == "device",
             **args)
        prog.watch_errors(heap)  # GPU calls are asynchronous: a timed-out wait is raised by a later call
        results = []
        for i, o in enumerate(self.outputs):
            if outs is not None:
                if args[o.name] is not outs[i]:
                    outs[i].copy_(args[o.name])
                    copies += 1
            elif o.symmetric:  # the staging buffer is reused by the next call: the caller gets its own copy
                results.append(args[o.name].clone())
                copies += 1
            else:
                results.append(args[o.name])
        self.stats["calls"] += 1
        self.stats["copies"] += copies
        if outs is not None:
            return None
        return results[0] if len(results) == 1 else tuple(results)

    def _check_capturable(self, prog, heap, dims) -> None:
        """A call recorded in a CUDA graph: its barriers are device kernels, so only schedules without host barriers
        between a call's kernels; and the variant must have run before (its set-up would be recorded too)."""
        if prog.has_host_barrier:
            raise ArgumentError(f"{self.qualname}: called while a CUDA graph is being captured, but its schedule "
                                f"{prog.schedule} has host barriers between a call's kernels, which a graph cannot "
                                f"hold; make the op with schedule= one of {', '.join(CAPTURABLE)}")
        if not prog.ready(heap):
            shape = ", ".join(f"{k}={v}" for k, v in dims.items())
            raise ArgumentError(f"{self.qualname}: the first call with these shapes ({shape}, world {prog.world}) "
                                "is being captured in a CUDA graph; call the op once with them before capturing "
                                "(the first call allocates and zeroes its heap buffers and compiles its kernels)")

    def _staged(self, prog, heap, pool: _Pool) -> dict[str, torch.Tensor]:
        """Staging buffers of every symmetric argument, allocated on the first call of a variant on every rank alike
        (whether or not this rank needs them: heap offsets must agree across ranks)."""
        keys = self._staging(prog)
        names = [n for n, (_k, _d, _s, sym) in prog.signature().items() if sym]
        need = sum(b for k, b in keys if k not in pool.bufs)
        if id(prog) not in pool.programs:
            need += _program_bytes(prog)
        free = heap.capacity - _align(heap.used)
        if need > free:
            raise HeapError(
                f"{self.qualname} ({', '.join(f'{k}={v}' for k, v in prog.dims.items())}, world {prog.world}): needs "
                f"{need} B more of the symmetric heap on rank {heap.rank}, {free} of {heap.capacity} B are free; "
                f"raise heap_bytes= of tilec.runtime.from_process_group / from_env / spawn (size it with "
                f"op.heap_bytes(...) summed over the model's ops), or --heap-mb")
        pool.programs.add(id(prog))  # variants live as long as their op
        out = {}
        for n, (key, _b) in zip(names, keys, strict=True):
            if key not in pool.bufs:
                dtype, shape, _i = key
                pool.bufs[key] = heap.alloc(shape, TORCH_DTYPE[dtype], zero=False)
                pool.end = heap.mark()
            out[n] = pool.bufs[key]
        return out


def _solve_symbolic(size, coef, const):
    """unknown = (size - const) / coef for symbolic sizes (coef a known rational or a symbolic size)."""
    if isinstance(coef, Fraction) and isinstance(const, int | Fraction):
        num = norm(size * coef.denominator - norm(const * coef.denominator))
        if isinstance(num, Fraction):
            raise NotAffine(None, "a fraction of a symbolic size")
        return num // coef.numerator
    return (norm(size) - norm(const)) // norm(coef)


def _program_bytes(prog) -> int:
    """Heap bytes a program allocates at its first call on a heap (CompiledProgram._buffers: its `buf` tensors,
    flags, ERR, EPOCH and timeline records), each rounded to the heap's alignment. Read from the program and its
    graph, so sizing a heap loads no Triton module."""
    from tilec.ir.graph import flags

    total = sum(_align(math.prod(t.shape) * TORCH_DTYPE[t.dtype].itemsize)
                for t in prog.program.tensors if t.kind == "buf")
    word = 8 if prog.options.backend == "nvshmem" else 4  # NVSHMEM signal words are 64-bit
    total += sum(_align(f.size * word) for f in flags(prog.graph))
    total += _align(8 * 4) + _align(2 * 4) + _align(2 * 4)  # ERR, EPOCH, BARRIER
    slots = re.search(r"^TIMELINE_SLOTS = (\d+)", prog.source, re.M)  # the module's table, without importing it
    if slots and int(slots.group(1)):
        total += _align(int(slots.group(1)) * 5 * 8)
    return total + ALIGN


class _Pool:
    """Staging buffers of one heap shared by every op, and the programs whose buffers that heap holds."""

    def __init__(self, heap):
        self.bufs: dict[tuple, torch.Tensor] = {}
        self.programs: set[int] = set()
        self.releases, self.end = heap.releases, 0  # end: just past the last staging buffer


_POOLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _pool(heap) -> _Pool:
    p = _POOLS.get(heap)
    if p is not None and heap.freed_since(p.releases, p.end):
        p = None  # heap.release() went below our buffers: allocate new ones
    if p is None:
        p = _POOLS[heap] = _Pool(heap)
    return p


def registered() -> dict[str, TileOp]:
    """Every op made in this process, by name."""
    return dict(_OPS)


__all__ = ["op", "empty", "TileOp", "registered", "SCHEDULE_PREFERENCE", "CAPTURABLE", "BARRIERS"]
