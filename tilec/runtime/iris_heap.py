"""GPU symmetric heap on Iris. Iris (and so triton) is imported only when a heap is built, so this
module imports cleanly on a CPU-only machine.

tilec takes the whole Iris heap as one arena (a single `shmem.empty`, made by every rank first,
hence at the same offset everywhere) and sub-allocates it in `Heap.alloc`; see heap.py for why.
"""

from __future__ import annotations

import logging
import os

import torch

from .errors import TilecRuntimeError
from .heap import Heap
from .liveness import BARRIER_TIMEOUT_S

log = logging.getLogger(__name__)

_MIN_BYTES = 1 << 21  # one CUDA VMM granule


def iris_heap_size(heap_bytes: int) -> int:
    """Round up to a power of two: Iris's vmem_chunked allocator rejects heaps below its 256 MiB chunk
    that are not powers of two, and rounds every allocation (our arena) up to one anyway."""
    n = max(int(heap_bytes), _MIN_BYTES)
    return 1 << (n - 1).bit_length()


def rank_device(rank: int) -> torch.device:
    """The GPU of `rank`: Iris picks `rank % device_count` itself, so this must match it."""
    n = torch.cuda.device_count()
    if n == 0:
        raise TilecRuntimeError("the iris backend needs a CUDA or ROCm GPU; none is visible (use backend 'cpu', "
                               "--backend cpu on the command line)")
    return torch.device("cuda", rank % n)


class IrisHeap(Heap):
    """This rank's Iris heap. Needs an initialized torch.distributed default group (gloo is enough:
    Iris uses it only for rendezvous and barriers, and NCCL refuses two ranks on one GPU).

    The capacity is `heap_bytes` rounded up to a power of two (at least 2 MiB).
    """

    backend = "iris"
    interpret = False

    def __init__(self, heap_bytes: int = 1 << 26, timeout: float = BARRIER_TIMEOUT_S):
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise TilecRuntimeError("IrisHeap needs torch.distributed initialized first (use spawn() or from_env())")
        rank, world = dist.get_rank(), dist.get_world_size()
        device = rank_device(rank)
        if torch.version.hip is None:
            # the default "torch" allocator cannot export memory on CUDA (DMA-BUF is AMD-only)
            os.environ.setdefault("IRIS_ALLOCATOR", "vmem_chunked")
        torch.cuda.set_device(device)  # Triton launches on torch's current device

        import iris

        if "IRIS_LOG_LEVEL" not in os.environ:
            # Iris logs several INFO lines per rank, and a warning per rank when ranks share a GPU (intended here)
            shared = world > torch.cuda.device_count()
            logging.getLogger("iris").setLevel(logging.ERROR if shared else logging.WARNING)
        size = iris_heap_size(heap_bytes)
        self._shmem = iris.iris(size)
        if self._shmem.get_rank() != rank or self._shmem.get_num_ranks() != world:
            raise TilecRuntimeError("Iris and torch.distributed disagree on rank/world size")
        arena = self._shmem.empty(size, dtype=torch.uint8)  # the first and only Iris allocation of every rank
        super().__init__(rank, world, arena.device, arena)
        if self.device != device:
            raise TilecRuntimeError(f"Iris placed rank {rank}'s heap on {self.device}, expected {device}")
        self._bases = self._shmem.get_heap_bases()
        self._destroy_group_on_close = False  # from_env sets it when it made the process group
        self.timeout = timeout  # a host barrier's wall-clock limit (Heap.host_barrier; the default group, as Iris's)

    @property
    def shmem(self):
        """The underlying `iris.Iris` object (for Iris host APIs tilec does not wrap)."""
        return self._shmem

    def heap_bases(self) -> torch.Tensor:
        self._check_open()
        return self._bases

    def barrier(self, tag: int | None = None) -> list[int | None]:
        self._check_open()
        self.finish_gpu_work()  # this rank's queued work is done
        return self.host_barrier(tag)  # Iris's own barrier (dist.barrier) would wait forever on a stopped or lost peer

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        self._bases = None
        shmem, self._shmem = self._shmem, None
        try:
            if self.gpu_work_settled():
                shmem.heap.close()  # unmaps peers, releases chunks; Iris.__del__ would do it at GC time
            else:
                log.warning("rank %d: GPU work still running at the Iris heap's close: left to the process's exit",
                            self.rank)
        except Exception as e:  # teardown must not mask the real outcome
            log.warning("rank %d: Iris heap close failed: %s", self.rank, e)
        if self._destroy_group_on_close:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
