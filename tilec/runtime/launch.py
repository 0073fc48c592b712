"""The host side of an emitted module: compile its kernels, size their grids, plan and launch one call.

An emitted module only declares its program: its kernels and the tables KERNELS (each kernel's tasks, launch
traits and tensor/flag parameters), TENSORS, FLAGS, NUM_WARPS, NUM_STAGES and EXIT_BARRIER. Everything here
reads those tables, so the launch path is one piece of code, not a copy per module.
"""

from __future__ import annotations

import contextlib
import os
import time

from tilec import settings

from . import dma

# the default cap (a program's own is tilec.compile(programs_per_sm=); the cost model sizes grids with this one)
MAX_PROGRAMS_PER_SM = settings.OPTIONS["programs_per_sm"].default

# a KERNELS entry: (kernel, tasks, persistent, concurrent, barrier before, share of the programs, program groups,
# the buffer names the kernel takes first, in order)
_EPOCH = -4  # where _args puts the epoch


def mps_client() -> bool:
    """Whether this process's CUDA work goes through an MPS server: a control daemon's pipe in
    CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps). Its clients run side by side on one GPU, each on the share
    of the SMs CUDA_MPS_ACTIVE_THREAD_PERCENTAGE gives it, which is what multi_processor_count then reports: the
    persistent grids below are sized from that share (benchmarks/runs/mps_world.sh)."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
    return os.path.exists(os.path.join(pipe, "control"))


class LaunchContext:
    """What the launch path needs from the runtime: rank, barrier, heap bases, grid sizes and streams, and what it
    keeps between calls (compiled kernels, occupancy, the last call's launch plan). pdl, programs_per_sm,
    dma_streams: the program's options (settings.Options; None: the defaults)."""

    def __init__(self, heap, timeout_ns: int, pdl: bool | None = None, programs_per_sm: int | None = None,
                 dma_streams: int | None = None, claim: str | None = None):
        opts = settings.options(pdl=pdl, programs_per_sm=programs_per_sm, dma_streams=dma_streams, claim=claim)
        self.programs_per_sm, self.dma_streams = opts.programs_per_sm, opts.dma_streams
        self.heap = heap
        self.rank = heap.rank
        self.interpret = heap.interpret
        self.timeout_ns = timeout_ns  # how long one flag wait may take, in wall-clock nanoseconds
        self._bases = None
        self._streams: dict[int, object] = {}
        # (kernel, NPROG, pointer alignments, graph) -> Triton's compiled kernel (warmup)
        self.compiled: dict = {}
        # (kernel, graph) -> programs resident per SM (fit), for persistent grids; a captured variant (graph=True)
        # is compiled and fitted on its own, so capturing never resizes the ordinary calls' grids
        self.per_sm: dict = {}
        self.plan: list | None = None  # the launches of a call, reused while the call's tensors stay the same
        self.dma = None  # the copy engines' plan of a call (runtime/dma.py), kept while the call's tensors stay
        self.graph = False  # launching into a CUDA graph capture (Program.capture): kernels read the epoch on device
        # (BARRIER, ERR) buffers of the call: its barriers are device kernels (device_barrier), not host ones
        self.device_barrier: tuple | None = None
        # programmatic dependent launch (sm_90+): a kernel may be launched before the previous one in its stream
        # has finished, and waits for it on the device (griddepcontrol) before touching memory; what it saves
        # is the gap between kernels. tilec.compile(pdl=False) turns it off.
        self.pdl = False
        # ranks side by side under MPS do not always get every SM their share reports (a persistent grid sized for
        # it was seen with 60 of 66 programs resident beside a peer's): claims keep such grids from waiting on or
        # idling behind programs still off the GPU (claim="on" / "off" forces them everywhere / nowhere: an A/B switch)
        self.claim = opts.claim == "on" or (opts.claim == "auto" and not heap.interpret and mps_client())
        if heap.interpret:
            self.capacity = 1  # the interpreter runs a launch's programs one after another
        else:
            import torch

            props = torch.cuda.get_device_properties(heap.device)
            # the SMs this process may use: under MPS its share (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), not the GPU's
            self.capacity = props.multi_processor_count
            self.pdl = torch.version.hip is None and getattr(props, "major", 0) >= 9 and opts.pdl

    def barrier(self) -> None:
        if self.device_barrier is not None:
            device_barrier(self, *self.device_barrier)
        else:
            self.heap.barrier()

    def heap_bases(self):
        if self._bases is None:
            self._bases = self.heap.heap_bases()
        return self._bases

    def grid(self, total: int, persistent: bool, share: float, groups: int = 0, kernel=None) -> int:
        """Persistent kernels get at most their share of the co-resident programs, so every program they wait
        on is running; others get one program per task. A specialized kernel needs a program per group at least
        (on the interpreter exactly that: groups run one after another, producers first)."""
        # kernels sharing the GPU with a concurrent one keep to one program per SM: their mix is not sized here
        per_sm = self.per_sm.get((kernel, self.graph), 1) if share >= 1 else 1
        slots = int(self.capacity * per_sm * share)
        if groups:
            return max(groups, min(total, slots))
        if not persistent:
            return total
        return max(1, min(total, slots))

    def fit(self, kernel, compiled, num_warps: int) -> None:
        """Programs of a compiled kernel that are resident on one SM at once (registers, shared memory, threads),
        capped at the program's programs_per_sm: a persistent grid may use that many per SM and still never wait on a
        program that is not running. Two per SM let one stream memory while the other computes or waits
        (the persistent flash decode went from 2.1 to 2.7 TB/s on an H200)."""
        import torch

        if torch.version.hip:  # wavefronts of 64 and VGPR budgets differ: one program per CU until measured there
            return
        try:
            compiled._init_handles()
            regs = max(1, int(compiled.n_regs))
            shared = int(compiled.metadata.shared)
        except (AttributeError, RuntimeError):  # a backend without these: stay at one program per SM
            return

        props = torch.cuda.get_device_properties(self.heap.device)
        regs_sm = getattr(props, "regs_per_multiprocessor", 65536)
        smem_sm = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
        threads_sm = getattr(props, "max_threads_per_multi_processor", 2048)
        warp_regs = -(-regs * 32 // 256) * 256  # registers are allocated per warp in units of 256
        fits = [regs_sm // (warp_regs * num_warps), threads_sm // (32 * num_warps)]
        if shared:
            fits.append(smem_sm // (shared + 1024))  # the driver reserves 1 KiB of shared memory per block
        self.per_sm[(kernel, self.graph)] = max(1, min(self.programs_per_sm, *fits))

    def stream(self, i: int):
        if self.interpret or i == 0:
            return contextlib.nullcontext()
        import torch

        if i not in self._streams:
            self._streams[i] = torch.cuda.Stream(device=self.heap.device)
        self._streams[i].wait_stream(torch.cuda.current_stream(self.heap.device))
        return torch.cuda.stream(self._streams[i])

    def join_streams(self) -> None:
        if self._streams:
            import torch

            cur = torch.cuda.current_stream(self.heap.device)
            for s in self._streams.values():
                cur.wait_stream(s)


def serial(mod) -> bool:
    """Whether a call's kernels run one after another. Programmatic dependent launch (LaunchContext.pdl) only then:
    a kernel launched early beside a concurrent pair could hold SMs that the pair's waiting kernel still needs."""
    return not any(k[3] for k in mod.KERNELS)


def claims(ctx, entry, nprog: int) -> bool:
    """Whether kernel `entry` at NPROG programs claims its tasks (tilec.device.first_task): a persistent kernel
    without program groups that has more tasks than programs (with fewer, every task has a program of its own, and a
    fold's sharing arrivals count on that), where LaunchContext.claim asks for it."""
    _k, total, persistent, _c, _b, _share, groups, _params = entry
    return getattr(ctx, "claim", False) and persistent and not groups and total > nprog


def kernel_args(ctx, buffers, epoch, entry, nprog, mod=None) -> tuple:
    """The positional arguments of one kernel of the KERNELS table, up to NPROG; the epoch at _EPOCH."""
    params = tuple(buffers[p] for p in entry[7])
    bases = ctx.heap_bases() if mod is None else module_bases(ctx, mod)
    return (*params, buffers["ERR"], bases, ctx.rank, epoch, ctx.timeout_ns, buffers["EPOCH"], nprog)


def module_bases(ctx, mod):
    """The heap-base table a module's kernels take: the heap's, or for a module of several nodes (backend nvshmem,
    RANKS_PER_NODE < WORLD) nvshmem_heap.node_bases of it (tilec/device_nvshmem.py reads it)."""
    per_node = getattr(mod, "RANKS_PER_NODE", None)
    if per_node is None or per_node >= mod.WORLD:
        return ctx.heap_bases()
    key = ("node_bases", per_node)
    if key not in ctx.compiled:
        from .nvshmem_launch import node_bases

        ctx.compiled[key] = node_bases(ctx.heap_bases(), ctx.rank, per_node)
    return ctx.compiled[key]


def extern_libs(ctx, mod, k) -> dict:
    """Launch options of kernel k of a module of several nodes (on a GPU) that calls NVSHMEM's device library: the
    printer names those `*_nvshmem` (codegen/nvshmem_printer.py); the others launch without it."""
    if ctx.interpret or getattr(mod, "RANKS_PER_NODE", mod.WORLD) >= mod.WORLD or not _needs_nvshmem(k):
        return {}
    from .nvshmem_launch import extern_libs as libs

    return {"extern_libs": libs([entry[0] for entry in mod.KERNELS if _needs_nvshmem(entry[0])])}


def _needs_nvshmem(k) -> bool:
    return getattr(getattr(k, "fn", k), "__name__", "").endswith("_nvshmem")


def warmup(ctx, mod, buffers) -> None:
    """Compile every kernel before any of them runs (loading a module while a spinning kernel runs can hang), and
    size persistent grids by how many programs of each kernel fit on an SM at once."""
    if ctx.interpret:
        return
    pdl = ctx.pdl and serial(mod)
    first = []
    for entry in mod.KERNELS:
        k, total, persistent, _concurrent, _barrier, share, groups, _params = entry
        nprog = ctx.grid(total, persistent, share, groups, k)
        first.append((entry, nprog, kernel_args(ctx, buffers, 1, entry, nprog, mod)))
    again = []
    for (entry, nprog, args), compiled in zip(first, _compile_all(ctx, mod, first, pdl), strict=True):
        k, total, persistent, _concurrent, _barrier, share, groups, _params = entry
        if persistent or groups:
            ctx.fit(k, compiled, mod.NUM_WARPS)
            more = ctx.grid(total, persistent, share, groups, k)
            if more != nprog:  # more programs fit per SM; NPROG is compiled in (a constant loop step), so again
                again.append((entry, more, kernel_args(ctx, buffers, 1, entry, more, mod)))
                continue
        ctx.compiled[(k, nprog, aligned(args), ctx.graph)] = compiled
    for (entry, nprog, args), compiled in zip(again, _compile_all(ctx, mod, again, pdl), strict=True):
        ctx.compiled[(entry[0], nprog, aligned(args), ctx.graph)] = compiled


def _compile_all(ctx, mod, jobs: list, pdl: bool) -> list:
    """Compile kernels (entry, NPROG, arguments) side by side: Triton's async compile mode runs each compile in a
    thread (LLVM's passes and ptxas release the GIL; NVSHMEM's library makes them seconds each) and finishes it (the
    module load, NVSHMEM's module init) in this one."""
    try:
        from triton.runtime._async_compile import AsyncCompileMode, active_mode
    except ImportError:  # a Triton without it: one after another
        AsyncCompileMode = active_mode = None
    if len(jobs) < 2 or AsyncCompileMode is None or active_mode.get() is not None:
        return [_compile(ctx, mod, e[0], args, pdl, claims(ctx, e, n)) for e, n, args in jobs]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(len(jobs), os.cpu_count() or 1), thread_name_prefix="tilec-compile") as pool, \
            AsyncCompileMode(pool, ignore_errors=True):  # errors are raised below, by the kernel's own result()
        futures = [_compile(ctx, mod, e[0], args, pdl, claims(ctx, e, n), wait=False) for e, n, args in jobs]
        return [f.result() if hasattr(f, "result") else f for f in futures]


def _compile(ctx, mod, k, args, pdl: bool, claim: bool, wait: bool = True):
    compiled = k.warmup(*args, INTERPRET=ctx.interpret, GRAPH=ctx.graph, PDL=pdl, CLAIM=claim, grid=(1,),
                        num_warps=mod.NUM_WARPS, num_stages=mod.NUM_STAGES, launch_pdl=pdl, **extern_libs(ctx, mod, k))
    if wait and hasattr(compiled, "result"):  # Triton's asynchronous compile mode hands back a future
        compiled = compiled.result()
    return compiled


def aligned(args) -> tuple[bool, ...]:
    """What Triton specializes pointers on (16-byte alignment): a compiled kernel is reused only for the same (and
    only for the program count NPROG it was compiled with)."""
    return tuple(a.data_ptr() % 16 == 0 for a in args if hasattr(a, "data_ptr"))


def _plan(ctx, buffers, i, entry, mod=None):
    # (stream, barrier before, compiled kernel's launcher or None, kernel, NPROG, arguments with a slot for the epoch)
    k, total, persistent, concurrent, barrier_before, share, groups, _params = entry
    nprog = ctx.grid(total, persistent, share, groups, k)
    args = list(kernel_args(ctx, buffers, 0, entry, nprog, mod))
    compiled = None if ctx.interpret else ctx.compiled.get((k, nprog, aligned(args), ctx.graph))
    runner = None
    if compiled is not None:
        # Triton's launcher takes a plain int as a pointer as is; a tensor costs a data_ptr() call and a
        # cuPointerGetAttribute per pointer per launch. The plan lives only while the call's tensors stay the same.
        args = [a.data_ptr() if hasattr(a, "data_ptr") else a for a in args]
        runner = compiled[(nprog, 1, 1)]
    return i if concurrent else 0, barrier_before, runner, k, nprog, args, claims(ctx, entry, nprog)


def adversary_delay(rank: int, world: int, epoch: int) -> None:
    """TILEC_CPU_ADVERSARY=SECONDS (CPU emulation only): in call `epoch`, rank `epoch % world` starts each kernel
    SECONDS late, so its peers' tasks reach their flag waits before the tiles they wait for exist. The interpreter
    runs a rank's tasks in order, so without this a missing or stale wait on a peer's tile would be hidden by luck."""
    late = settings.value("TILEC_CPU_ADVERSARY")
    if late and rank == epoch % world:
        time.sleep(late)


def graph_mode(mod) -> bool | int:
    """GRAPH of a call whose epoch lives on the device (graph capture, ops): 2 where the call is one kernel, which
    advances the epoch itself at its end (tilec.device.leave); True (the caller bumps it before the kernels) where
    several kernels or copy-engine stages read it during the call."""
    return 2 if len(mod.KERNELS) == 1 and not getattr(mod, "DMA_COPIES", None) else True


def launch(ctx, mod, buffers, epoch, entry_barrier=True, only=None, entered=False) -> None:
    """One call of the module's program on this rank: a barrier so every rank's inputs are ready, then the kernels
    (and a closing barrier where peers touch this rank's inputs/outputs). entry_barrier=False skips both: the
    caller orders calls itself. only: the numbers of the kernels to launch (the rest are skipped). entered: the
    caller has passed the entry barrier itself (CompiledProgram's, which carries the arguments' placement)."""
    if entry_barrier and not entered:
        ctx.barrier()
    if ctx.plan is None:  # the launches of a call with these tensors; calls differ only in the epoch
        ctx.plan = [_plan(ctx, buffers, i, entry, mod) for i, entry in enumerate(mod.KERNELS)]
    # stages on the copy engines start first: their sources are ready after the entry barrier, and the kernels
    # wait on their chunks' flags
    copies = dma.start(ctx, mod, buffers, epoch)
    try:
        _launch_kernels(ctx, mod, epoch, only)
    finally:
        dma.finish(copies)
    if entry_barrier and mod.EXIT_BARRIER:
        ctx.barrier()


def _launch_kernels(ctx, mod, epoch, only) -> None:
    pdl = ctx.pdl and serial(mod)
    for i, (stream, barrier_before, runner, k, nprog, args, claim) in enumerate(ctx.plan):
        if only is not None and i not in only:
            continue
        if barrier_before:
            ctx.barrier()
        if ctx.interpret:
            adversary_delay(ctx.rank, mod.WORLD, epoch)
        args[_EPOCH] = epoch
        with ctx.stream(stream):
            if runner is not None:  # straight to the compiled kernel: skips the JIT's per-call argument binding
                runner(*args, ctx.interpret, ctx.graph, pdl, claim)
            else:
                k[(nprog,)](*args, INTERPRET=ctx.interpret, GRAPH=ctx.graph, PDL=pdl, CLAIM=claim,
                            num_warps=mod.NUM_WARPS,
                            num_stages=mod.NUM_STAGES, launch_pdl=pdl, **extern_libs(ctx, mod, k))
    ctx.join_streams()


def device_barrier(ctx, bar, err, warm: bool = False) -> None:
    """A barrier of every rank as a one-program kernel on the current stream (tilec.device.barrier), which a CUDA
    graph can hold; the host does not wait. warm=True compiles it without running it (before a capture); once
    compiled it is launched straight, as the plan's kernels are."""
    import tilec.device as td

    args = (bar, err, ctx.heap_bases(), ctx.rank, ctx.timeout_ns)
    key = ("barrier", aligned(args))
    if warm:
        if not ctx.interpret:
            compiled = td.barrier.warmup(*args, WORLD=ctx.heap.world, INTERPRET=False, grid=(1,), num_warps=1)
            ctx.compiled[key] = compiled.result() if hasattr(compiled, "result") else compiled
        return
    compiled = ctx.compiled.get(key)
    if compiled is not None:
        compiled[(1, 1, 1)](*(a.data_ptr() if hasattr(a, "data_ptr") else a for a in args), ctx.heap.world, False)
    else:
        td.barrier[(1,)](*args, WORLD=ctx.heap.world, INTERPRET=ctx.interpret, num_warps=1)
