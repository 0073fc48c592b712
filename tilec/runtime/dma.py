"""The copy engines' side of a call: run a module's DMA_COPIES plan (codegen/dma.py) beside its kernels.

A chunk's copies go out in order on a side stream, then the call's epoch is copied into the chunk's flag counter
on the same stream, so the counter turns over only after the data landed; the persistent kernel on every SM waits
per tile as for SM-moved tiles. Nothing here runs on an SM: a kernel on the side stream (even a one-thread flag
release) could wait forever for a slot while the consumer's programs hold every SM spinning on that very flag.

  GPU: `cudaMemcpyAsync` / `cudaMemcpy2DAsync` between heap addresses (a peer's heap is mapped in this process,
       Iris's heap_bases), one stream per peer (up to the program's dma_streams, default 4), local tiles first. The flag
       value is a 4-byte copy from a device cell holding the epoch, not a constant: an ordinary call fills the cell
       from pinned host memory (an H2D copy); a captured call uses the EPOCH cell that the graph bumps on the device
       (a constant, such as cuStreamWriteValue32's, would be frozen into the graph and stale at the next replay).
  CPU emulation: the same plan as host copies in order and plain 4-byte flag stores, in a thread, so the
       interpreter's consumer kernel really waits on the flags (x86 keeps stores in order: data before flag).
"""

from __future__ import annotations

import ctypes
import threading
import time

import torch

from tilec import settings
from tilec.codegen.dma import chunk_streams

from .errors import TilecRuntimeError

MAX_STREAMS = settings.OPTIONS["dma_streams"].default  # the default (a program's own: LaunchContext.dma_streams)


def start(ctx, mod, buffers, epoch: int):
    """Issue this rank's chunks of call `epoch`; returns what `finish` waits for (None: nothing to do)."""
    table = getattr(mod, "DMA_COPIES", None)
    if not table or ctx.rank not in table:
        return None
    chunks = table[ctx.rank]
    key = _key(chunks, buffers)
    if ctx.dma is None or ctx.dma.key != key:  # views of this call's tensors, kept while they stay the same (a
        # capture reuses the ordinary call's: building them is host work that a CUDA graph capture must not see)
        ctx.dma = (_CpuPlan if ctx.interpret else _GpuPlan)(ctx, chunks, buffers)
        ctx.dma.key = key
    ctx.dma.start(epoch, buffers, mod.WORLD)
    return ctx.dma


def _key(chunks, buffers) -> tuple:
    names = {c[0] for c in chunks if c[0] is not None} | {x for c in chunks for cp in c[3] for x in (cp[0], cp[4])}
    return tuple((n, buffers[n].data_ptr()) for n in sorted(names)) + (("EPOCH", buffers["EPOCH"].data_ptr()),)


def finish(plan) -> None:
    if plan is not None:
        plan.finish()


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1)


class _CpuPlan:
    def __init__(self, ctx, chunks, buffers):
        self.ctx, self.chunks = ctx, chunks
        heap = ctx.heap
        self.views: dict[tuple[str, int], torch.Tensor] = {}
        for param, _counter, owner, copies in chunks:
            for src, srank, _so, _sp, dst, drank, *_ in copies:
                self._view(heap, buffers, src, srank)
                self._view(heap, buffers, dst, drank)
            if param is not None:
                self._view(heap, buffers, param, owner)
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def _view(self, heap, buffers, name: str, rank: int) -> None:
        if (name, rank) not in self.views:
            t = buffers[name]
            self.views[(name, rank)] = _flat(t if rank == heap.rank else heap.peer_view(t, rank))

    def start(self, epoch: int, buffers, world: int) -> None:
        self.error = None
        self.thread = threading.Thread(target=self._run, args=(epoch, world), daemon=True,
                                       name=f"tilec-dma-r{self.ctx.rank}")
        self.thread.start()

    def _run(self, epoch: int, world: int) -> None:
        try:
            late = settings.value("TILEC_CPU_ADVERSARY")
            if late:  # later than the kernels on every rank (launch.adversary_delay holds one rank's kernels back):
                # a consumer that reads a chunk without waiting for its flag then reads stale data
                time.sleep(late * (2 if self.ctx.rank == epoch % world else 1))
            for param, counter, owner, copies in self.chunks:
                for src, srank, so, sp, dst, drank, do, dp, width, rows in copies:
                    s = self.views[(src, srank)]
                    d = self.views[(dst, drank)]
                    d.as_strided((rows, width), (dp, 1), d.storage_offset() + do).copy_(
                        s.as_strided((rows, width), (sp, 1), s.storage_offset() + so))
                if param is not None:
                    self.views[(param, owner)][counter] = epoch
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread by finish()
            self.error = e

    def finish(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            e, self.error = self.error, None
            raise TilecRuntimeError(f"rank {self.ctx.rank}: a copy-engine chunk failed: {e}") from e


_DEFAULT = 4  # cudaMemcpyDefault: the driver tells this GPU's memory from a peer's mapped heap (unified addresses)


def _cudart():
    """The CUDA runtime torch loaded (by soname), with the two copy calls typed."""
    for name in ("libcudart.so.12", "libcudart.so.13", "libcudart.so"):
        try:
            rt = ctypes.CDLL(name)
        except OSError:
            continue
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        rt.cudaMemcpyAsync.argtypes = [vp, vp, sz, ctypes.c_int, vp]
        rt.cudaMemcpy2DAsync.argtypes = [vp, sz, vp, sz, sz, sz, ctypes.c_int, vp]
        return rt
    raise TilecRuntimeError("transport=dma needs the CUDA runtime library (libcudart.so.12) to issue copy-engine "
                            "copies; none could be loaded (ROCm is not supported yet)")


class _GpuPlan:
    """Built once per call's tensors, outside any capture (addresses are host work); a call only issues copies.

    Copies are raw `cudaMemcpyAsync` / `cudaMemcpy2DAsync` calls between addresses, not torch copies: a tensor over
    a peer GPU's memory would belong to that GPU, and torch would run a cross-device copy on the peer's stream."""

    def __init__(self, ctx, chunks, buffers):
        self.ctx, self.chunks = ctx, chunks
        heap = ctx.heap
        self.device = heap.device
        bases = getattr(ctx, "_dma_bases", None)
        if bases is None:  # a device-to-host read: once, at the first (never captured) call
            bases = ctx._dma_bases = [int(b) for b in heap.heap_bases().tolist()]
        me = heap.rank

        def addr(name: str, rank: int) -> int:
            t = buffers[name]
            if rank == me:
                return t.data_ptr()
            return bases[rank] + heap.offset_of(t)  # symmetric: the same offset in the peer's heap

        # per stream, in issue order: (dst, dpitch, src, spitch, width, rows) in bytes (rows 1: one contiguous run),
        # or (counter address,) for a flag; a chunk goes to the stream of its peer's ring distance, so the peers'
        # chunks overlap on the engines
        streams: list[list[tuple]] = []
        for (param, counter, owner, copies), si in zip(chunks, chunk_streams(chunks, me, heap.world, ctx.dma_streams),
                                                       strict=True):
            while len(streams) <= si:
                streams.append([])
            for src, srank, so, sp, dst, drank, do, dp, width, rows in copies:
                es, ed = buffers[src].element_size(), buffers[dst].element_size()
                if es != ed:
                    raise TilecRuntimeError(f"dma copy {src} -> {dst}: element sizes {es} and {ed} differ")
                if dp == width and sp == width:
                    width, rows = width * rows, 1
                streams[si].append((addr(dst, drank) + do * ed, dp * ed, addr(src, srank) + so * es, sp * es,
                                    width * es, rows))
            if param is not None:
                # counters are 4-byte words (Iris) or NVSHMEM's 8-byte signal words; the copy writes the epoch's 4
                # bytes into the word's low half (little-endian), whose high half stays 0 (epochs stay below 2**31)
                streams[si].append((addr(param, owner) + buffers[param].element_size() * counter,))
        self.ops = streams
        pool = ctx.__dict__.setdefault("_dma_streams", [])  # side streams live as long as the context
        while len(pool) < len(streams):
            pool.append(torch.cuda.Stream(device=self.device))
        self.streams = pool[:len(streams)]
        self.epoch_cell = buffers["EPOCH"]  # what a captured call copies into the counters (bumped on the device)
        self.cell = torch.zeros(1, dtype=torch.int32, device=self.device)  # an ordinary call's epoch
        self.rt = _cudart()
        self.rt.cudaSetDevice(self.device.index if self.device.index is not None else torch.cuda.current_device())

    def start(self, epoch: int, buffers, world: int) -> None:
        cur = torch.cuda.current_stream(self.device)
        if self.ctx.graph:
            cell = self.epoch_cell.data_ptr()
        else:  # the epoch through pinned memory (an H2D copy, no kernel), on the main stream before the fork; the
            # last call's flag copies read the cell before it: finish() joined them into the main stream
            self.cell.copy_(torch.tensor([epoch], dtype=torch.int32).pin_memory(), non_blocking=True)
            cell = self.cell.data_ptr()
        rt = self.rt
        for stream, ops in zip(self.streams, self.ops, strict=True):
            stream.wait_stream(cur)  # after the entry barrier (and the epoch: captured bump or H2D)
            h = ctypes.c_void_p(stream.cuda_stream)
            for op in ops:
                if len(op) == 1:  # the chunk's flag, after its copies in stream order
                    rc = rt.cudaMemcpyAsync(op[0], cell, 4, _DEFAULT, h)
                elif op[5] == 1:
                    rc = rt.cudaMemcpyAsync(op[0], op[2], op[4], _DEFAULT, h)
                else:
                    rc = rt.cudaMemcpy2DAsync(op[0], op[1], op[2], op[3], op[4], op[5], _DEFAULT, h)
                if rc:
                    raise TilecRuntimeError(f"rank {self.ctx.rank}: a copy-engine copy failed (cudaError {rc})")

    def finish(self) -> None:
        cur = torch.cuda.current_stream(self.device)
        for s in self.streams:
            cur.wait_stream(s)
