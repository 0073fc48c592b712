"""The compiled program: its Triton source, its graph, and a callable that runs it on the active heap."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx

from tilec.errors import ArgumentError, TilecError
from tilec.frontend.sema import BoundProgram
from tilec.ir.graph import flags
from tilec.ir.printer import print_graph
from tilec.runtime import launch
from tilec.runtime.launch import MAX_PROGRAMS_PER_SM, LaunchContext  # noqa: F401 - where callers import them


class WaitTimeout(TilecError):
    """A flag wait that could not be satisfied: named rank, flag, tile and what was seen."""


def cache_dir() -> Path:
    d = Path(os.environ.get("TILEC_CACHE", Path.home() / ".cache" / "tilec"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def load_module(source: str, name: str):
    """Import generated source from a file (Triton reads kernels' source with inspect, so exec() won't do)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    mod_name = f"tilec_gen_{name}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    path = cache_dir() / f"{mod_name}.py"
    if not path.exists() or path.read_text() != source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)  # atomic: concurrent rank processes never see half a file
    spec = importlib.util.spec_from_file_location(mod_name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod


DEFAULT_WAIT_TIMEOUT = 60.0  # seconds of wall-clock time one flag wait may take (TILEC_WAIT_TIMEOUT overrides)


def wait_timeout_seconds(value: float | None) -> float:
    """The wait timeout a program uses: `value` (tilec.compile(wait_timeout=...)), else the TILEC_WAIT_TIMEOUT
    environment variable, else DEFAULT_WAIT_TIMEOUT; a positive, finite number of seconds."""
    what = "wait_timeout"
    if value is None:
        env = os.environ.get("TILEC_WAIT_TIMEOUT")
        if env is None:
            return DEFAULT_WAIT_TIMEOUT
        what = "TILEC_WAIT_TIMEOUT"
        try:
            value = float(env)
        except ValueError:
            raise ArgumentError(f"TILEC_WAIT_TIMEOUT={env!r}: expected seconds, e.g. 60") from None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
        raise ArgumentError(f"{what}={value!r}: expected seconds, a number > 0 (and below 1e9)")
    return float(value)


@dataclass
class CompiledProgram:
    """`tilec.compile(...)` returns this. `.source` is the Triton module, `.graph` the final tile dataflow graph;
    calling it inside a rank process (with an active heap) runs one call of the program on that rank."""

    program: BoundProgram
    schedule: str
    source: str
    graph: nx.DiGraph
    snapshots: dict[str, nx.DiGraph] = field(repr=False)
    wait_timeout: float | None = None  # seconds; None: wait_timeout_seconds's default
    _state: dict = field(default_factory=dict, repr=False)
    candidates: list | None = None  # schedule='auto': every legal schedule with predicted/measured time

    def __post_init__(self):
        self.wait_timeout = wait_timeout_seconds(self.wait_timeout)

    @property
    def world(self) -> int:
        return self.program.world

    @property
    def dims(self) -> dict[str, int]:
        return dict(self.program.dims)

    @property
    def module(self):
        mod = self._state.get("module")
        if mod is None:  # hashing the source to find the module costs tens of us: once, not per call
            mod = self._state["module"] = load_module(self.source, self.program.name)
        return mod

    def show(self, after: str | None = None) -> str:
        """The graph as text, after the named pass (default: the last)."""
        if after is None:
            return print_graph(self.graph)
        if after not in self.snapshots:
            raise TilecError(f"no pass named '{after}' ran in schedule {self.schedule}; passes: "
                             f"{', '.join(self.snapshots)}")
        return print_graph(self.snapshots[after])

    def save(self, path: str | os.PathLike) -> None:
        p = Path(path)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(self.source)
        os.replace(tmp, p)

    def __getstate__(self):
        d = dict(self.__dict__)
        d["_state"] = {}
        return d

    # -- running ---------------------------------------------------------------------------------
    def signature(self) -> dict[str, tuple[str, str, tuple[int, ...], bool]]:
        """Arguments a call takes: name -> (kind, dtype, shape, symmetric); `buf` tensors are internal."""
        return {t.name: (t.kind, t.dtype, t.shape, t.symmetric) for t in self.program.tensors if t.kind != "buf"}

    def _buffers(self, heap) -> dict:
        key = id(heap)
        st = self._state.get(key)
        if st is None:
            import torch

            from tilec.reference import TORCH_DTYPE

            bufs = {}
            for n, (kind, dtype, shape, _sym) in self.module.TENSORS.items():
                if kind == "buf":
                    bufs[n] = heap.alloc(shape, TORCH_DTYPE[dtype])
            for param, (size, *_rest) in self.module.FLAGS.items():
                bufs[param] = heap.alloc((size,), torch.int32)
            bufs["ERR"] = heap.alloc((8,), torch.int32)
            bufs["EPOCH"] = heap.alloc((1,), torch.int32)  # the epoch of calls replayed from a CUDA graph
            if getattr(self.module, "TIMELINE_SLOTS", 0):
                bufs["TIMELINE"] = heap.alloc((self.module.TIMELINE_SLOTS * 5,), torch.int64)
            timeout_ns = int(self.wait_timeout * 1e9)  # wall-clock, per wait (tilec.device.wait)
            # epoch: calls so far; dev_epoch: what bufs["EPOCH"] holds (only captured calls advance it there)
            st = {"heap": heap, "bufs": bufs, "epoch": 0, "dev_epoch": 0, "ctx": LaunchContext(heap, timeout_ns),
                  "warm": False}
            self._state[key] = st
        return st

    def check_args(self, heap, tensors: dict) -> None:
        import torch

        from tilec.reference import TORCH_DTYPE

        sig = self.signature()
        for name in tensors:
            if name not in sig:
                internal = any(t.name == name for t in self.program.tensors)
                why = " (it is an internal buffer)" if internal else ""
                raise ArgumentError(f"{self.program.name}: unexpected argument '{name}'{why}; it takes "
                                    f"{', '.join(sig)}")
        for name, (kind, dtype, shape, sym) in sig.items():
            if name not in tensors:
                raise ArgumentError(f"{self.program.name}: missing argument '{name}' ({kind} {dtype}{list(shape)})")
            t = tensors[name]
            if not isinstance(t, torch.Tensor):
                raise ArgumentError(f"argument '{name}': expected a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != shape:
                raise ArgumentError(f"argument '{name}': shape {list(t.shape)} but the program declares "
                                    f"{dtype}{list(shape)} (dims {self.dims})")
            if t.dtype != TORCH_DTYPE[dtype]:
                raise ArgumentError(f"argument '{name}': dtype {str(t.dtype).removeprefix('torch.')} but the program"
                                    f" declares {dtype}")
            if t.device.type != heap.device.type:
                raise ArgumentError(f"argument '{name}': on device {t.device} but rank {heap.rank}'s heap is on"
                                    f" {heap.device}")
            if not t.is_contiguous():
                raise ArgumentError(f"argument '{name}': must be contiguous")
            if sym and not heap.owns(t):
                raise ArgumentError(f"argument '{name}': declared symmetric, so it must be allocated on the heap"
                                    " (heap.alloc / tilec.runtime.active_heap().alloc)")

    def __call__(self, heap=None, *, entry_barrier: bool = True, sync: bool = True, only=None, **tensors):
        """One call on this rank. entry_barrier=False skips the leading cross-rank barrier (the caller then
        guarantees every rank's inputs are ready and the previous call is finished everywhere, e.g. a benchmark
        that barriers outside its timed region). sync=False returns once the kernels are queued; a wait
        timeout is then reported by the next synchronous call. only=(i, ...): launch only these kernels (what
        one stage of a bsp schedule costs alone); only schedules without flags, whose counters would fall out of
        step with the call count."""
        heap = _heap(heap)
        if heap.world != self.world:
            raise ArgumentError(f"{self.program.name} was compiled for world {self.world}, the heap has "
                                f"{heap.world} ranks")
        if only is not None:
            n = len(self.module.KERNELS)
            if not isinstance(only, (tuple, list)):
                raise ArgumentError(f"only={only!r}: a tuple of kernel numbers, e.g. only=(0, 1)")
            if flags(self.graph):
                raise ArgumentError(f"only={only!r}: schedule {self.schedule} has flags; only= takes a schedule "
                                    "without them (bsp)")
            if not all(type(i) is int and 0 <= i < n for i in only):
                raise ArgumentError(f"only={only!r}: kernel numbers are 0 to {n - 1} here")
        st = self._buffers(heap)
        key = tuple((n, t.data_ptr(), tuple(t.shape), t.dtype) for n, t in sorted(tensors.items())
                    if hasattr(t, "data_ptr"))
        if st.get("checked") != key:  # the same tensors as last call need no second look, nor a new launch plan
            self.check_args(heap, tensors)
            st["checked"] = key
            st["ctx"].plan = None
        bufs = {**st["bufs"], **tensors}
        mod = self.module
        if not st["warm"]:
            launch.warmup(st["ctx"], mod, bufs)
            st["warm"] = True
        st["epoch"] += 1
        launch.launch(st["ctx"], mod, bufs, st["epoch"], entry_barrier, only)
        return self._finish(heap, st, tensors) if sync else None

    def _finish(self, heap, st, tensors: dict) -> dict:
        """The end of a synchronous call (or replay): wait for the GPU, report a wait that timed out, and hand back
        the outputs."""
        if not heap.interpret:
            import torch

            torch.cuda.synchronize(heap.device)
        self._check_timeout(heap, st)
        return {n: tensors[n] for n, (kind, *_r) in self.signature().items() if kind == "out"}

    @property
    def has_host_barrier(self) -> bool:
        """Whether a call stops for a host barrier between its kernels (bsp), which a CUDA graph cannot hold."""
        return any(barrier_before for _k, _n, _p, _c, barrier_before, *_r in self.module.KERNELS)

    def capture(self, heap=None, **tensors) -> CapturedCall:
        """One call recorded as a CUDA graph on these tensors: `replay()` runs it again without the Python launch
        path, on whatever the tensors hold then, writing the outputs into them. The graph bumps the flags' epoch
        on the device (the kernels read it there), so replays and ordinary calls can alternate. Needs a GPU and a
        schedule with no host barrier inside a call (a graph cannot hold one: fused-push, specialized, flags);
        every rank captures, and replays as often as the others."""
        import torch

        heap = _heap(heap)
        name, mod = self.program.name, self.module
        if self.has_host_barrier:
            raise ArgumentError(f"{name}: schedule {self.schedule} has a host barrier inside a call, which a CUDA "
                                "graph cannot hold; capture a schedule without one (fused-push, specialized, flags)")
        if heap.interpret:
            raise ArgumentError(f"{name}: capture records a CUDA graph, which needs a GPU; on the CPU emulation "
                                "call the program")
        self(heap, **tensors)  # checks the arguments, compiles, and is an ordinary call that must succeed
        st = self._buffers(heap)
        ctx, bufs = st["ctx"], {**st["bufs"], **tensors}
        graph = torch.cuda.CUDAGraph()
        ctx.graph, ctx.plan = True, None
        try:
            launch.warmup(ctx, mod, bufs)  # the variants that read the epoch on the device, compiled before the capture
            bufs["EPOCH"].fill_(st["epoch"])
            st["dev_epoch"] = st["epoch"]
            torch.cuda.synchronize(heap.device)
            with torch.cuda.graph(graph):
                bufs["EPOCH"].add_(1)
                launch.launch(ctx, mod, bufs, 0, entry_barrier=False)
        finally:
            ctx.graph, ctx.plan = False, None
        return CapturedCall(self, heap, graph, dict(tensors))

    def programs_per_sm(self, heap) -> int:
        """Programs per SM the persistent kernels were sized for on this heap's GPU (LaunchContext.fit; 1 before
        the first call, on the CPU emulation, and for kernels that are not persistent)."""
        st = self._state.get(id(heap))
        return max((n for (_k, graph), n in st["ctx"].per_sm.items() if not graph), default=1) if st else 1

    def timeline(self, heap=None):
        """Where this rank's last call went (tilec.timeline.Timeline); needs a build with timeline=True. Reads the
        records of the last call, so call it after a synchronous call."""
        from tilec.ir.graph import stages
        from tilec.timeline import summarize

        if not getattr(self.module, "TIMELINE_SLOTS", 0):
            raise ArgumentError(f"{self.program.name}: not a timeline build (tilec.compile(..., timeline=True))")
        heap = _heap(heap)
        st = self._state.get(id(heap))
        if st is None or not st["epoch"]:
            raise ArgumentError(f"{self.program.name}: no call has run on rank {heap.rank}'s heap yet")
        recs = st["bufs"]["TIMELINE"].view(-1, 5).cpu()
        return summarize(recs, self.module, [x.name for x in stages(self.graph)])

    def _check_timeout(self, heap, st) -> None:
        err = st["bufs"]["ERR"]
        vals = err.tolist()
        if not vals[0]:
            return
        err.zero_()
        fl = flags(self.graph)[vals[1] - 1]
        from tilec.passes.replace_barriers import flag_dims

        dims = flag_dims(self.graph, fl)
        coords, rest = [], vals[2]
        for d in reversed(dims):
            if d.size > 1:
                coords.append((d, rest % d.size))
                rest //= d.size
        where = ", ".join(f"dim{d.dim}={c}" for d, c in reversed(coords)) or "all"
        raise WaitTimeout(f"rank {heap.rank} waited on flag {fl.name}[{vals[2]}] ({where}) on rank {vals[3]} for"
                          f" ~{self.wait_timeout:g}s: it reached {vals[4]} of {vals[5]}; stage {fl.producer} on the"
                          " producing rank never released it (call counts differ between ranks, a producer is"
                          " missing, or the persistent grid outgrew the programs resident at once: try"
                          " TILEC_PROGRAMS_PER_SM=1)")


def _heap(heap):
    """The heap a call runs on: the one given, else this rank process's (tilec.runtime.active_heap)."""
    if heap is not None:
        return heap
    from tilec.runtime import active_heap

    return active_heap()


class CapturedCall:
    """A call of a CompiledProgram recorded as a CUDA graph (CompiledProgram.capture)."""

    def __init__(self, prog: CompiledProgram, heap, graph, tensors: dict):
        self.prog, self.heap, self.graph, self.tensors = prog, heap, graph, tensors

    def replay(self, *, entry_barrier: bool = True, sync: bool = True):
        """Runs the recorded call again; entry_barrier and sync as for CompiledProgram.__call__. Returns the outputs
        when synchronous."""
        prog, heap = self.prog, self.heap
        st = prog._buffers(heap)
        if entry_barrier:
            heap.barrier()
        if st["dev_epoch"] != st["epoch"]:  # ordinary calls ran since the last replay: the device epoch catches up
            st["bufs"]["EPOCH"].fill_(st["epoch"])
        st["epoch"] += 1
        st["dev_epoch"] = st["epoch"]
        self.graph.replay()
        if entry_barrier and prog.module.EXIT_BARRIER:  # peers read this rank's tensors until the end of the call
            heap.barrier()
        return prog._finish(heap, st, self.tensors) if sync else None
