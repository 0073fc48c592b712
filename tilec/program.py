"""The compiled program: its Triton source, its graph, and a callable that runs it on the active heap."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx

from tilec import settings
from tilec.errors import ArgumentError, TilecError
from tilec.frontend.sema import BoundProgram
from tilec.ir.gather import INDEX_RANGE, index_range_error
from tilec.ir.graph import flags, kernels_of
from tilec.ir.printer import print_graph
from tilec.runtime import launch
from tilec.runtime.errors import KernelsStuck
from tilec.runtime.launch import MAX_PROGRAMS_PER_SM, LaunchContext  # noqa: F401 - where callers import them


class WaitTimeout(TilecError):
    """A flag wait that could not be satisfied: named rank, flag, tile and what was seen. The fields are attributes
    too (rank, flag, tensor, counter, tile, owner, seen, target, stage, loc)."""

    def __init__(self, message: str, **fields):
        super().__init__(message)
        self.fields = fields
        for k, v in fields.items():
            setattr(self, k, v)

    def __reduce__(self):
        return _rebuild_wait_timeout, (str(self), self.fields)


def _rebuild_wait_timeout(message: str, fields: dict) -> WaitTimeout:
    return WaitTimeout(message, **fields)


def cache_dir() -> Path:
    d = Path(settings.value("TILEC_CACHE"))
    d.mkdir(parents=True, exist_ok=True)
    return d


def module_key(source: str) -> str:
    """The cache key of a generated module: a digest of its text, whose header records the options it was compiled
    with (settings.Options), so a program compiled another way is another module."""
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def load_module(source: str, name: str):
    """Import generated source from a file (Triton reads kernels' source with inspect, so exec() won't do)."""
    mod_name = f"tilec_gen_{name}_{module_key(source)}"
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


DEFAULT_WAIT_TIMEOUT = settings.OPTIONS["wait_timeout"].default  # seconds one flag wait may take


def wait_timeout_seconds(value: float | None) -> float:
    """The wait timeout a program uses: `value` (tilec.compile(wait_timeout=...)), else DEFAULT_WAIT_TIMEOUT; a
    positive, finite number of seconds."""
    return float(settings.option("wait_timeout", value))


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
    backend_note: str | None = None  # schedule='auto': why Iris's kernels run where backend nvshmem was asked for
    options: settings.Options | None = None  # what it was compiled with (None: the defaults, this wait_timeout)

    def __post_init__(self):
        self.wait_timeout = wait_timeout_seconds(self.wait_timeout)
        self.options = dataclasses.replace(self.options or settings.options(), wait_timeout=self.wait_timeout)

    @property
    def cache_key(self) -> str:
        """The key its module is cached under (load_module): the program's name and a digest of the module's text,
        options included."""
        return f"{self.program.name}_{module_key(self.source)}"

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

    def draw(self, after: str | None = None, format: str = "dot", path: str | os.PathLike | None = None):  # noqa: A002
        """The tile dataflow graph after the named pass (default: the last) as a picture: DOT text (format "dot"),
        or svg/png bytes through graphviz; also written to `path` when given. Without graphviz's `dot`, svg/png
        raise tilec.ir.dot.RenderUnavailable (with a path, after writing PATH.dot), saying how to render it."""
        from tilec.ir.dot import draw

        if after is not None and after not in self.snapshots:
            raise TilecError(f"no pass named '{after}' ran in schedule {self.schedule}; passes: "
                             f"{', '.join(self.snapshots)}")
        g = self.graph if after is None else self.snapshots[after]
        title = f"schedule {self.schedule}, after {after or list(self.snapshots)[-1]}"
        return draw(g, format, path, title)

    def save(self, path: str | os.PathLike) -> None:
        """Write the Triton module to `path` (a regular file or a new path; replaced atomically)."""
        from tilec.fileio import write_atomic

        write_atomic(path, self.source)

    def __repr__(self) -> str:  # one line: the dataclass repr prints the whole source and graph
        dims = ", ".join(f"{k}={v}" for k, v in (*self.program.dims, *self.program.tiles))
        return f"<CompiledProgram {self.program.name} schedule={self.schedule} world={self.world} dims({dims})>"

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
        if st is not None and heap.freed_since(st["releases"], st["span"][1]):
            st = None  # heap.release() freed the internal buffers and flags: new ones, flags from epoch 0
        if st is None:
            if getattr(self.module, "RANKS_PER_NODE", self.world) < self.world and heap.backend == "iris":
                raise ArgumentError(f"{self.program.name}: compiled for several nodes (backend nvshmem, ranks_per_node="
                                    f"{self.module.RANKS_PER_NODE}), which an Iris heap cannot reach: run it on a heap "
                                    "of backend nvshmem (or the CPU emulation)")
            start, releases = heap.mark(), heap.releases
            import torch

            from tilec.reference import TORCH_DTYPE

            bufs = {}
            for n, (kind, dtype, shape, _sym) in self.module.TENSORS.items():
                if kind == "buf":
                    bufs[n] = heap.alloc(shape, TORCH_DTYPE[dtype])
            signal_words = getattr(self.module, "BACKEND", "iris") == "nvshmem"  # NVSHMEM signals are 64-bit
            for param, (size, *_rest) in self.module.FLAGS.items():
                bufs[param] = heap.alloc((size,), torch.int64 if signal_words else torch.int32)
            bufs["ERR"] = heap.alloc((8,), torch.int32)
            # [epoch of the last call kept on the device (graph replays, ops), programs finished (launch.graph_mode)],
            # then per kernel [tasks claimed, programs done] (launch.claims: tilec.device.first_task)
            bufs["EPOCH"] = heap.alloc((2 + 2 * len(self.module.KERNELS),), torch.int32)
            bufs["BARRIER"] = heap.alloc((2,), torch.int32)  # arrivals and entries of device barriers (device.barrier)
            if getattr(self.module, "TIMELINE_SLOTS", 0):
                bufs["TIMELINE"] = heap.alloc((self.module.TIMELINE_SLOTS * 5,), torch.int64)
            timeout_ns = int(self.wait_timeout * 1e9)  # wall-clock, per wait (tilec.device.wait)
            # epoch: calls so far; dev_epoch: what bufs["EPOCH"] holds (only captured calls advance it there)
            st = {"heap": heap, "bufs": bufs, "epoch": 0, "dev_epoch": 0, "ctx": LaunchContext(
                heap, timeout_ns, self.options.pdl, self.options.programs_per_sm, self.options.dma_streams,
                self.options.claim),
                  "warm": False, "releases": releases, "span": (start, heap.mark())}
            self._state[key] = st
        return st

    def check_args(self, heap, tensors: dict, st: dict | None = None) -> None:
        """Every argument against the declaration: names, type, shape, dtype, layout, device, contiguity, heap
        placement of symmetric ones, and memory: no output may share a byte with another argument, and no argument
        with the program's internal buffers on this heap (`st`). Raises ArgumentError naming the argument."""
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
            if t.layout != torch.strided:
                raise ArgumentError(f"argument '{name}': layout {t.layout}, must be a dense (strided) tensor")
            if tuple(t.shape) != shape:
                raise ArgumentError(f"argument '{name}': shape {list(t.shape)} but the program declares "
                                    f"{dtype}{list(shape)} (dims {self.dims})")
            if t.dtype != TORCH_DTYPE[dtype]:
                raise ArgumentError(f"argument '{name}': dtype {str(t.dtype).removeprefix('torch.')} but the program"
                                    f" declares {dtype}")
            if not _same_device(t.device, heap.device):
                raise ArgumentError(f"argument '{name}': on device {t.device} but rank {heap.rank}'s heap is on"
                                    f" {heap.device}")
            if not t.is_contiguous():
                raise ArgumentError(f"argument '{name}': must be contiguous")
            if sym and not heap.owns(t):
                raise ArgumentError(f"argument '{name}': declared symmetric, so it must be allocated on the heap"
                                    " (heap.alloc / tilec.runtime.active_heap().alloc)")
        self._check_overlaps(heap, tensors, st)

    def _check_overlaps(self, heap, tensors: dict, st: dict | None) -> None:
        """Outputs are written while inputs and other outputs are read: any shared byte gives a wrong result.
        Inputs may share memory with each other (both only read). No argument may lie in the program's own
        buffers and flags (reallocated by the user after a heap.release)."""
        from tilec.runtime.heap import _address, _extent

        sig = self.signature()
        spans = {n: (_address(t), _address(t) + _extent(t)) for n, t in tensors.items() if t.numel()}
        names = list(spans)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                if "out" not in (sig[a][0], sig[b][0]):
                    continue
                (a0, a1), (b0, b1) = spans[a], spans[b]
                if a0 < b1 and b0 < a1:
                    out, other = (a, b) if sig[a][0] == "out" else (b, a)
                    raise ArgumentError(f"argument '{out}': output overlaps {sig[other][0]} '{other}' in memory "
                                        f"(bytes 0x{max(a0, b0):x}-0x{min(a1, b1):x}); an output must not share "
                                        "memory with another argument")
        if st is None:
            return
        lo, hi = st["span"]  # offsets in the heap, as heap.mark() counts them
        for n, (a0, a1) in spans.items():
            off = heap.offset_of(tensors[n]) if heap.owns(tensors[n]) else None
            if off is not None and off < hi and lo < off + (a1 - a0):
                raise ArgumentError(f"argument '{n}': lies in this program's internal buffers on rank {heap.rank}'s"
                                    " heap (allocated at its first call on this heap); allocate arguments outside "
                                    "them, or release the heap below them so that the next call allocates new ones")

    def __call__(self, heap=None, *, entry_barrier: bool = True, sync: bool = True, only=None,
                 device_epoch: bool = False, device_barrier: bool = False, **tensors):
        """One call on this rank. entry_barrier=False skips the leading cross-rank barrier (the caller then
        guarantees every rank's inputs are ready and the previous call is finished everywhere, e.g. a benchmark
        that barriers outside its timed region). sync=False returns once the kernels are queued; a wait
        timeout is then reported by the next synchronous call. only=(i, ...): launch only these kernels (what
        one stage of a bsp schedule costs alone); only schedules without flags, whose counters would fall out of
        step with the call count.

        device_epoch=True: the call count lives on the device (bumped there, read there by the kernels), so calls
        recorded in a CUDA graph the caller captures (torch.cuda.graph, torch.compile's cudagraphs) replay as
        calls of their own; a program's calls on a heap all keep it there or all on the host, from the first.
        device_barrier=True (needs device_epoch): the call's barriers are device kernels, which a graph can hold,
        instead of host ones."""
        heap = _heap(heap)
        if device_barrier and not device_epoch:
            raise ArgumentError(f"{self.program.name}: device_barrier=True needs device_epoch=True (a barrier the "
                                "host does not wait for can be replayed from a graph, and so must the epoch)")
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
        if st.setdefault("device_epoch", device_epoch) != device_epoch:
            where = "device" if st["device_epoch"] else "host"
            raise ArgumentError(f"{self.program.name}: its calls on rank {heap.rank}'s heap keep their epoch on the "
                                f"{where} since the first one; call with device_epoch={st['device_epoch']}")
        ctx = st["ctx"]
        key = _args_key(tensors)
        if key is None or st.get("checked") != key:  # the same tensors as last call need no second look, nor a
            self.check_args(heap, tensors, st)       # new launch plan
            st["placement"] = place = self._placement(heap, tensors, st)
            digest = hashlib.blake2b(repr(tuple(off for _n, off in place)).encode(), digest_size=8).digest()
            st["placement_tag"] = int.from_bytes(digest, "little") >> 1  # 63 bits: heap.barrier's tag
            st["checked"] = key
            ctx.plan = None
        bufs = {**st["bufs"], **tensors}
        mod = self.module
        ctx.graph = launch.graph_mode(mod) if device_epoch else False  # kernels that read the epoch on the device
        try:
            if not st["warm"]:
                launch.warmup(ctx, mod, bufs)
                if device_epoch:  # compiled now: a later call may be the one a graph capture records
                    launch.device_barrier(ctx, bufs["BARRIER"], bufs["ERR"], warm=True)
                if device_barrier and entry_barrier:  # a peer's first arrival must not land before this rank
                    self._enter(heap, st)  # zeroed its counters (just allocated): one host barrier, on the first call
                st["warm"] = True
            entered = entry_barrier and not device_barrier
            if entered:  # the entry barrier, which also checks every rank's placement (before the epoch moves on)
                self._enter(heap, st)
            st["epoch"] += 1
            if ctx.graph is True:  # (a one-kernel call advances it itself: launch.graph_mode)
                bufs["EPOCH"][:1].add_(1)
            ctx.device_barrier = (bufs["BARRIER"], bufs["ERR"]) if device_barrier else None
            launch.launch(ctx, mod, bufs, st["epoch"], entry_barrier, only, entered=entered)
        finally:
            ctx.graph, ctx.device_barrier = False, None
        return self._finish(heap, st, tensors) if sync else None

    def _placement(self, heap, tensors: dict, st: dict) -> tuple[tuple[str, int], ...]:
        """Where this rank's symmetric arguments and this program's internal buffers lie in its heap (byte offsets):
        a peer reads and writes them at this rank's offsets (heap bases differ, offsets must not)."""
        out = [(n, heap.offset_of(tensors[n])) for n, (_k, _d, _s, sym) in self.signature().items() if sym]
        return (*out, ("", st["span"][0]))  # "": the internal buffers and flags, allocated at the first call

    def _enter(self, heap, st: dict) -> None:
        """The entry barrier of a call, carrying a digest of this rank's placement: raises ArgumentError on every
        rank when the ranks' placements differ (a symmetric argument at another offset would be read and written
        at the wrong addresses by its peers, silently)."""
        place = st["placement"]
        tags = heap.barrier(st["placement_tag"])
        if all(t == tags[heap.rank] for t in tags if t is not None):
            return
        if any(t is None for t in tags):  # a rank stands in a plain barrier, not in a call: no second round
            differ = [r for r, t in enumerate(tags) if t is not None and t != tags[heap.rank]]
            raise ArgumentError(f"{self.program.name}: rank {heap.rank}'s symmetric arguments lie at other heap "
                                f"offsets than rank {differ[0]}'s; every rank must allocate them in the same order")
        # every rank is in a call and saw the same digests: they exchange the offsets one by one (the failing path)
        if len(set(heap.barrier(len(place)))) > 1:
            raise ArgumentError(f"{self.program.name}: the ranks call programs of different symmetric arguments at "
                                "once")
        for name, off in place:
            offs = heap.barrier(off)
            if len(set(offs)) == 1:
                continue
            at = {}
            for r, o in enumerate(offs):
                at.setdefault(o, []).append(r)
            where = "; ".join(f"{o} on rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs[:8]))}"
                              + (", ..." if len(rs) > 8 else "") for o, rs in sorted(at.items(), key=lambda x: x[1]))
            if name:
                raise ArgumentError(f"argument '{name}': declared symmetric, so peers address it at the heap offset it "
                                    f"has on their own rank, but it lies at byte offset {where}; allocate the "
                                    "symmetric tensors in the same order and sizes on every rank")
            raise ArgumentError(f"{self.program.name}: its internal buffers and flags (allocated at its first call on "
                                f"this heap) lie at byte offset {where}, and peers address them at their own; "
                                "allocate the same tensors in the same order on every rank before the first call")

    def ready(self, heap=None) -> bool:
        """Whether a call has set this program up on the heap (its buffers allocated and zeroed, its kernels
        compiled): only then may a call be recorded in a CUDA graph, which would record that set-up too."""
        heap = _heap(heap)
        st = self._state.get(id(heap))
        return bool(st and st["warm"] and not heap.freed_since(st["releases"], st["span"][1]))

    def _finish(self, heap, st, tensors: dict) -> dict:
        """The end of a synchronous call (or replay): wait for the GPU, report a wait that timed out, and hand back
        the outputs."""
        self._wait_and_check(heap, st)
        return {n: tensors[n] for n, (kind, *_r) in self.signature().items() if kind == "out"}

    def _wait_and_check(self, heap, st) -> None:
        """Wait for the GPU's queued work, then raise WaitTimeout if a wait in it timed out; KernelsStuck if it had
        not finished long after every wait of its kernels would have timed out (no hang on a kernel stuck elsewhere)."""
        if not heap.interpret:
            from tilec.runtime.gpu_wait import finish_queued, stuck_after

            limit = stuck_after(self.wait_timeout, len(self.module.KERNELS))
            if not finish_queued(heap.device, limit):
                raise KernelsStuck(heap.rank, limit, (
                    f"rank {heap.rank}: the kernels of {self.program.name} ({self.schedule}) had not finished {limit:g}"
                    f" s after the host began waiting for them, though each flag wait of theirs stops after "
                    f"wait_timeout={self.wait_timeout:g} s: they are stuck outside tilec's waits (in a library call "
                    "they make, such as NVSHMEM's puts, gets or quiet), or their work really takes that long (then "
                    "raise wait_timeout)"))
        self._check_timeout(heap, st)

    @property
    def kernel_count(self) -> int:
        """How many kernels persist grouped the stages into."""
        return len(kernels_of(self.graph))

    @property
    def has_host_barrier(self) -> bool:
        """Whether a call stops for a host barrier between its kernels (bsp), which a CUDA graph cannot hold."""
        return any(barrier_before for _k, _n, _p, _c, barrier_before, *_r in self.module.KERNELS)

    def capture_refusal(self, heap=None) -> str | None:
        """Why capture() cannot record a call of this program on this heap, or None where it can."""
        heap = _heap(heap)
        mod = self.module
        if self._state.get(id(heap), {}).get("device_epoch"):
            return ("its calls keep their epoch on the device (device_epoch=True, as tilec ops do): capture them "
                    "with torch.cuda.graph instead of capture()")
        if self.has_host_barrier:
            return (f"schedule {self.schedule} has a host barrier inside a call, which a CUDA graph cannot hold; "
                    "capture a schedule without one (fused-push, specialized, flags)")
        if heap.interpret:
            return "capture records a CUDA graph, which needs a GPU; on the CPU emulation call the program"
        if getattr(mod, "RANKS_PER_NODE", mod.WORLD) < mod.WORLD:
            return (f"compiled for several nodes (ranks_per_node={mod.RANKS_PER_NODE}), whose calls start with a "
                    "host barrier a CUDA graph cannot hold (the device barrier reaches peers by pointer); call the "
                    "program instead")
        return None

    def capture(self, heap=None, **tensors) -> CapturedCall:
        """One call recorded as a CUDA graph on these tensors: `replay()` runs it again without the Python launch
        path, on whatever the tensors hold then, writing the outputs into them. The graph bumps the flags' epoch
        on the device (the kernels read it there), so replays and ordinary calls can alternate. Needs a GPU and a
        schedule with no host barrier inside a call (a graph cannot hold one: fused-push, specialized, flags);
        every rank captures, and replays as often as the others."""
        import torch

        heap = _heap(heap)
        mod = self.module
        why = self.capture_refusal(heap)
        if why:
            raise ArgumentError(f"{self.program.name}: {why}")
        self(heap, **tensors)  # checks the arguments, compiles, and is an ordinary call that must succeed
        st = self._buffers(heap)
        ctx, bufs = st["ctx"], {**st["bufs"], **tensors}
        graph = torch.cuda.CUDAGraph()
        ctx.graph, ctx.plan = launch.graph_mode(mod), None
        try:
            launch.warmup(ctx, mod, bufs)  # the variants that read the epoch on the device, compiled before the capture
            bufs["EPOCH"][:1].fill_(st["epoch"])
            st["dev_epoch"] = st["epoch"]
            torch.cuda.synchronize(heap.device)
            with torch.cuda.graph(graph):
                if ctx.graph is True:
                    bufs["EPOCH"][:1].add_(1)
                launch.launch(ctx, mod, bufs, 0, entry_barrier=False)
        finally:
            ctx.graph, ctx.plan = False, None
        return CapturedCall(self, heap, graph, dict(tensors))

    def programs_per_sm(self, heap) -> int:
        """Programs per SM the persistent kernels were sized for on this heap's GPU (LaunchContext.fit; 1 before
        the first call, on the CPU emulation, and for kernels that are not persistent)."""
        st = self._state.get(id(heap))
        return max((n for (_k, graph), n in st["ctx"].per_sm.items() if not graph), default=1) if st else 1

    def timeline_records(self, heap=None):
        """This rank's per-task records of its last call, a [tasks, 5] int64 CPU tensor of (stage number, program,
        start, waited, end) in ns; needs a build with timeline=True. tilec.perf.timeline.summarize reads them.
        Call it after a synchronous call."""
        if not getattr(self.module, "TIMELINE_SLOTS", 0):
            raise ArgumentError(f"{self.program.name}: not a timeline build (tilec.compile(..., timeline=True))")
        heap = _heap(heap)
        st = self._state.get(id(heap))
        if st is None or not st["epoch"]:
            raise ArgumentError(f"{self.program.name}: no call has run on rank {heap.rank}'s heap yet")
        return st["bufs"]["TIMELINE"].view(-1, 5).cpu()

    def watch_errors(self, heap) -> None:
        """After an asynchronous call (sync=False): copy the call's error record to the host on a side stream, so a
        later `raise_recorded` sees a wait that timed out without making the caller wait for the GPU. One copy in
        flight at a time (a call while one is still in flight is covered by the next call's copy, which is stream-
        ordered after it); none while a CUDA graph is being captured (a replay is checked by the next call)."""
        import torch

        st = self._state.get(id(heap))
        if heap.interpret or st is None or torch.cuda.is_current_stream_capturing():
            return
        done = st.get("err_watch")
        if done is not None and not (done.query() and not st["err_host"][0]):
            return  # still in flight, or it saw an error the next call raises
        if "err_host" not in st:
            st["err_host"] = torch.zeros(8, dtype=torch.int32, pin_memory=True)
            st["err_stream"] = torch.cuda.Stream(device=heap.device)
        after = torch.cuda.Event()
        after.record()
        side, done = st["err_stream"], torch.cuda.Event()
        side.wait_event(after)
        with torch.cuda.stream(side):
            st["err_host"].copy_(st["bufs"]["ERR"], non_blocking=True)
            done.record(side)
        st["err_watch"] = done

    def raise_recorded(self, heap, wait: bool = False) -> None:
        """Raise WaitTimeout if an earlier call's wait timed out. wait=False looks only at a finished
        `watch_errors` copy (no wait for the GPU); wait=True waits for every queued call and reads the record."""
        import torch

        st = self._state.get(id(heap))
        if st is None or heap.interpret:
            return
        if not wait:
            done = st.get("err_watch")
            if done is None or torch.cuda.is_current_stream_capturing() or not done.query():
                return
            if not st["err_host"][0]:
                st["err_watch"] = None
                return
        st["err_watch"] = None
        self._wait_and_check(heap, st)  # the full report from the device's record, which it then clears

    def _check_timeout(self, heap, st) -> None:
        err = st["bufs"]["ERR"]
        vals = err.tolist()
        if not vals[0]:
            return
        err.zero_()
        if vals[0] == INDEX_RANGE:  # a row index or count out of range (codegen/gathers.py)
            raise index_range_error(self.program, vals, heap.rank)
        _, flag_no, counter, owner, seen, target = vals[:6]
        if flag_no == 0:  # tilec.device.barrier: counter is the barrier's number, seen and target arrivals
            world = heap.world
            raise WaitTimeout(
                f"rank {heap.rank} waited at device barrier {counter} of {self.program.name} for "
                f"~{self.wait_timeout:g}s: {seen - (counter - 1) * world} of {world} ranks arrived (a rank did not "
                "make this call, call counts differ between ranks, or a rank stopped or died)",
                rank=heap.rank, flag="barrier", tensor=None, counter=counter, tile=None, owner=owner, seen=seen,
                target=target, stage=None, loc=None)
        fl = flags(self.graph)[flag_no - 1]  # flag numbers are 1-based in name order, as emit numbers them
        from tilec.ir.graph import stage as stage_of
        from tilec.ir.queries import flag_dims

        tile, loops = _counter_tile(flag_dims(self.graph, fl), counter)
        producer = stage_of(self.graph, fl.producer)
        calls = f"call {target // fl.count}, {fl.count} releases a call" if fl.count else "no releases a call"
        raise WaitTimeout(
            f"rank {heap.rank} waited on flag {fl.name}[{counter}] (tile {fl.tensor}[{tile}]{loops}) on rank {owner}"
            f" for ~{self.wait_timeout:g}s: it reached {seen} of {target}; stage {fl.producer} on the producing rank"
            f" never released it ({calls}; stage {fl.producer} is at {producer.loc}; call counts differ"
            " between ranks, a producer is missing, a rank stopped or died, or the persistent grid outgrew the"
            " programs resident at once: try programs_per_sm=1)",
            rank=heap.rank, flag=fl.name, tensor=fl.tensor, counter=counter, tile=tile, owner=owner, seen=seen,
            target=target, stage=fl.producer, loc=str(producer.loc))


def _counter_tile(dims, counter: int) -> tuple[str, str]:
    """Flag counter index -> the tile it guards, as element ranges of the flagged tensor ("64:128, :"), and the
    producer loop values that write it (" where r=1, m=64"). A dim the flag does not key is ':' (every producer
    tile along it is counted together)."""
    from tilec.ir.tiling import strides

    parts, loops = [], []
    for d, stride in zip(dims, strides(dims), strict=True):
        c = counter // stride % d.size if d.size > 1 else 0
        r = (c // d.trips if d.key_tile else c) if d.key_rank else None
        t = c % d.trips if d.key_tile else None
        if r is not None:
            loops.append(f"{d.rank_var}={r}")
        if t is not None:
            loops.append(f"{d.tile_var}={t * d.step}")
        if d.tile_var and t is None:
            parts.append(":")  # the tile loop of this dim is not keyed: the counter covers all its tiles
            continue
        base = d.const + (d.rank_coef * r if r is not None else 0)
        lo = base + (t * d.step if d.tile_var else 0)
        hi = min(lo + d.step, base + d.extent) if d.tile_var else lo + 1
        span = f"{lo}:{hi}" if hi != lo + 1 else str(lo)
        # an unkeyed rank loop: one counter for the tile at every value of it
        parts.append(f"{span} + {d.rank_coef}*{d.rank_var}" if d.rank_var and r is None else span)
    return ", ".join(parts), (" where " + ", ".join(loops) if loops else "")


def _args_key(tensors: dict):
    """What a call's arguments must keep for the last check to still hold: everything that decides where and how
    the kernels read and write (address, storage offset and so the storage's address, shape, strides, dtype,
    device, layout); None when an argument is not a tensor (checked, and refused, every time)."""
    key = []
    for n, t in sorted(tensors.items()):
        try:
            key.append((n, t.data_ptr(), t.storage_offset(), t.shape, t.stride(), t.dtype, t.device, t.layout))
        except (AttributeError, RuntimeError, TypeError):
            return None
    return tuple(key)


def _same_device(a, b) -> bool:
    """Devices equal once an index-less cuda device is read as the current one."""
    if a.type != b.type:
        return False
    if a.type == "cpu" or a.index == b.index:
        return True
    import torch

    cur = torch.cuda.current_device() if a.type == "cuda" else 0
    return (a.index if a.index is not None else cur) == (b.index if b.index is not None else cur)


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
            st["bufs"]["EPOCH"][:1].fill_(st["epoch"])
        st["epoch"] += 1
        st["dev_epoch"] = st["epoch"]
        self.graph.replay()
        if entry_barrier and prog.module.EXIT_BARRIER:  # peers read this rank's tensors until the end of the call
            heap.barrier()
        return prog._finish(heap, st, self.tensors) if sync else None
