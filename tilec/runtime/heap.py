"""The symmetric heap interface shared by the CPU emulation and the Iris GPU backend.

Both backends hand the base class one contiguous byte arena that starts at the same offset from
`heap_bases()[rank]` on every rank; the bump allocator below carves tensors out of it. Doing the
sub-allocation here (instead of one Iris allocation per tensor) keeps offsets symmetric by
construction: Iris's vmem allocators round each request up to a power of two of at least one
granule (2 MiB on NVIDIA) and reuse freed blocks when Python's GC runs, which differs per rank.
"""

from __future__ import annotations

import abc
import bisect
import math
from collections.abc import Sequence

import torch

from .errors import HeapError
from .liveness import BARRIER_TIMEOUT_S

ALIGN = 256  # bytes; every allocation starts on this boundary (enough for vector loads of any dtype)

Shape = int | Sequence[int] | torch.Size


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _shape(shape: Shape) -> tuple[int, ...]:
    if isinstance(shape, int):
        return (shape,)
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimension in shape {dims}")
    return dims


def _address(t: torch.Tensor) -> int:
    """Address of t's first element; unlike data_ptr() also defined (not 0) for empty tensors."""
    return t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size()


def _extent(t: torch.Tensor) -> int:
    """Bytes from t's first element to just past its last one (its footprint in memory)."""
    if t.numel() == 0:
        return 0
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
    return (last + 1) * t.element_size()


CLOSE_WAIT_S = 10.0  # seconds closing a GPU heap waits for the rank's queued work (gpu_work_settled)


class Heap(abc.ABC):
    """One rank's view of a symmetric heap.

    Every rank calls `alloc` in the same order with the same arguments and so gets a tensor at the
    same offset in its own heap; kernels translate a local pointer to a peer's with `heap_bases()`.
    """

    backend: str = ""
    interpret: bool = False  # True when kernels must run under TRITON_INTERPRET=1
    timeout: float = BARRIER_TIMEOUT_S  # a host barrier's wall-clock limit (host_barrier)
    group = None  # the torch.distributed group host barriers run over (None: the default group)
    _peers: dict[int, int] | None = None  # rank -> pid of every peer, from the first host barrier

    def __init__(self, rank: int, world: int, device: torch.device, arena: torch.Tensor):
        if arena.dtype != torch.uint8 or arena.dim() != 1:
            raise TypeError("the heap arena must be a 1-D uint8 tensor")
        self.rank = rank
        self.world = world
        self.device = torch.device(device)
        self.capacity = arena.numel()
        self.used = 0
        self.closed = False
        self._arena = arena
        self._base = arena.data_ptr()
        self.releases = 0  # release() calls so far
        # (release number, mark) with marks increasing: the lowest mark released since any release number
        self._lowest: list[tuple[int, int]] = []

    # -- allocation ------------------------------------------------------------------------------

    def alloc(self, shape: Shape, dtype: torch.dtype, *, zero: bool = True) -> torch.Tensor:
        """Symmetric bump allocation of a contiguous tensor (call on every rank, same order)."""
        self._check_open()
        dims = _shape(shape)
        nbytes = math.prod(dims) * dtype.itemsize
        start = _align(self.used)
        if start + nbytes > self.capacity:
            raise HeapError(
                f"heap exhausted on rank {self.rank}: alloc({dims}, {dtype}) needs {nbytes} B at offset {start}, "
                f"{self.used} of {self.capacity} B used; raise heap_bytes= (spawn/from_env) or --heap-mb"
            )
        self.used = start + nbytes
        t = self._arena[start : start + nbytes].view(dtype).view(dims)
        if zero:
            t.zero_()
        return t

    def mark(self) -> int:
        """The allocation watermark, for `release` (temporary buffers of one run)."""
        return self.used

    def release(self, mark: int) -> None:
        """Free everything allocated after `mark` (all ranks must do it alike). Freed memory is not cleared.

        A collective: it starts with a barrier, because after a call returns on this rank its peers may still be
        reading this rank's buffers and flags (their last waits), and the next allocation zeroes them."""
        if type(mark) is not int or not 0 <= mark <= self.used:
            raise HeapError(f"release({mark!r}) outside the allocated range [0, {self.used}]")
        if self.world > 1:
            self.barrier()
        self.used = mark
        while self._lowest and self._lowest[-1][1] >= mark:
            self._lowest.pop()
        self._lowest.append((self.releases, mark))
        self.releases += 1

    def freed_since(self, releases: int, end: int) -> bool:
        """Whether memory below offset `end` was released after the first `releases` releases (the buffers a
        compiled program allocated then are gone: its next call allocates new ones)."""
        i = bisect.bisect_left(self._lowest, (releases, -1))
        return i < len(self._lowest) and self._lowest[i][1] < end

    # -- queries ---------------------------------------------------------------------------------

    def owns(self, t: torch.Tensor) -> bool:
        """True when all of t's elements lie inside this rank's heap."""
        if self.closed or t.device != self.device:
            return False
        start = _address(t) - self._base
        return 0 <= start and start + _extent(t) <= self.capacity

    def offset_of(self, t: torch.Tensor) -> int:
        """Byte offset of t's first element from this rank's heap base (equal on all ranks)."""
        if not self.owns(t):
            raise HeapError(f"tensor at 0x{_address(t):x} on {t.device} is not in rank {self.rank}'s heap")
        return _address(t) - self._base

    def peer_view(self, t: torch.Tensor, rank: int) -> torch.Tensor:
        """A tensor aliasing t's allocation in `rank`'s heap (host-side access; not on every backend)."""
        raise NotImplementedError(f"peer_view is not available on the {self.backend} backend")

    # -- backend hooks ---------------------------------------------------------------------------

    @abc.abstractmethod
    def heap_bases(self) -> torch.Tensor:
        """int64 [world] tensor on `device`: each rank's heap base address as seen by this process."""

    @abc.abstractmethod
    def barrier(self, tag: int | None = None) -> list[int | None]:
        """Cross-rank barrier (every rank must call it); also waits for this rank's queued device work. `tag`: an
        int (63 bits) this rank shows the others at the barrier; returns every rank's, rank by rank (None where a
        rank gave none). A program call's entry barrier carries the placement of its symmetric arguments."""

    def host_barrier(self, tag: int | None = None) -> list[int | None]:
        """A barrier over `self.group` (None: the default group) that gives up after `self.timeout` seconds, and
        within seconds when a peer's process dies or stays stopped (PeerLost naming it), instead of hanging
        (dist.barrier waits for the group's timeout, and forever on a stopped peer). Every barrier is the same
        collective, an all-gather of (has a tag, tag), so tagged and untagged barriers of different ranks meet.
        The first one also tells every rank its peers' pids."""
        import os

        import torch.distributed as dist

        from .liveness import wait_work

        timeout, group, peers = self.timeout, self.group, self._peers
        if not (dist.is_available() and dist.is_initialized()):
            if self.world > 1:
                raise HeapError(f"{type(self).__name__}.barrier needs a torch.distributed process group when world > 1")
            return [tag]
        if self.world == 1:
            dist.barrier(group=group)
            return [tag]
        dev = "cpu" if dist.get_backend(group) == "gloo" else self.device  # NCCL moves CUDA tensors only
        mine = [0, 0] if tag is None else [1, int(tag)]
        if peers is None:
            mine = [os.getpid(), *mine]
        rows = [torch.zeros(len(mine), dtype=torch.int64, device=dev) for _ in range(self.world)]
        work = dist.all_gather(rows, torch.tensor(mine, dtype=torch.int64, device=dev), group=group, async_op=True)
        wait_work(work, self.rank, "heap set-up barrier" if peers is None else "barrier", timeout, peers)
        got = [r.tolist() for r in rows]
        if peers is None:
            self._peers = {r: row[0] for r, row in enumerate(got) if r != self.rank}
            got = [row[1:] for row in got]
        return [row[1] if row[0] else None for row in got]

    def finish_gpu_work(self) -> None:
        """Wait for this rank's queued GPU work, as a barrier does first, for at most `self.timeout` seconds (the
        barrier's own limit): KernelsStuck when it has not finished by then. Every flag wait in it stops after its
        wait_timeout, so such kernels are stuck elsewhere; torch.cuda.synchronize would wait for them forever."""
        from .errors import KernelsStuck
        from .gpu_wait import finish_queued

        if not finish_queued(self.device, self.timeout):
            raise KernelsStuck(self.rank, self.timeout, (
                f"rank {self.rank}: the GPU work queued before a heap barrier had not finished after "
                f"{self.timeout:g} s (the barrier's limit), though each flag wait in it stops after its wait_timeout:"
                " a kernel is stuck outside tilec's waits"))

    def gpu_work_settled(self) -> bool:
        """Whether this rank's queued GPU work finished within CLOSE_WAIT_S, as closing a GPU heap waits for it: if
        not (kernels stuck; the call or barrier that saw it has raised), the heap's memory is left mapped for the
        process's exit to reclaim rather than pulled from under a running kernel, and the close does not hang."""
        from .gpu_wait import finish_queued

        return finish_queued(self.device, CLOSE_WAIT_S)

    def close(self) -> None:
        """Release the heap. Tensors allocated from it must not be used afterwards."""
        if self.closed:
            return
        self.closed = True
        self._arena = None  # active_heap() refuses a closed heap, so the context needs no notice

    def _check_open(self) -> None:
        if self.closed:
            raise HeapError(f"the {self.backend} heap of rank {self.rank} is closed")

    def __enter__(self) -> Heap:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.used}/{self.capacity} B used"
        return f"<{type(self).__name__} rank {self.rank}/{self.world} on {self.device}, {state}>"
