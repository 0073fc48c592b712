"""GPU symmetric heap on NVSHMEM through torch symmetric memory, for modules compiled with backend="nvshmem".

One `symm_mem.empty` arena per rank (made by every rank first, so at the same offset everywhere), rendezvoused over
the default process group (rank and world are the group's); `Heap.alloc` sub-allocates it as on the other backends.
The heap-base table is the rendezvous' `buffer_ptrs`: peers of this node by pointer. Kernels that reach peers
off the node get nvshmem_launch's table made of it and NVSHMEM's device library linked. torch, NVSHMEM and triton are
imported only when a heap is built or a kernel compiled, so this module imports cleanly on a CPU-only machine.
"""

from __future__ import annotations

import logging
import warnings

import torch

from .errors import TilecRuntimeError
from .heap import Heap
from .liveness import BARRIER_TIMEOUT_S

log = logging.getLogger(__name__)


def nvshmem_available() -> bool:
    try:
        import torch.distributed._symmetric_memory as symm_mem
    except Exception:  # noqa: BLE001 - a torch without symmetric memory
        return False
    return bool(torch.cuda.is_available() and getattr(symm_mem, "is_nvshmem_available", lambda: False)())


def _check_gpus(world: int) -> torch.device:
    import torch.distributed as dist

    n = torch.cuda.device_count()
    if n == 0:
        raise TilecRuntimeError("backend nvshmem needs a CUDA GPU; none is visible (use backend 'cpu', --backend cpu "
                                "on the command line: its emulation runs the same kernels)")
    if not nvshmem_available():
        raise TilecRuntimeError("backend nvshmem needs NVSHMEM in torch (torch.distributed._symmetric_memory."
                                "is_nvshmem_available() is False): install a CUDA build of torch with NVSHMEM, or use "
                                "backend iris")
    if world > n:
        from .launch import mps_client

        if not mps_client():
            raise TilecRuntimeError(f"backend nvshmem with {world} ranks on {n} GPU(s) needs MPS (NVSHMEM fails to "
                                    "start several PEs on one GPU without it): start nvidia-cuda-mps-control -d first "
                                    "(docs/SCALE.md)")
    return torch.device("cuda", dist.get_rank() % n)


class NvshmemHeap(Heap):
    """This rank's heap on torch symmetric memory with the NVSHMEM backend. Needs an initialized torch.distributed
    default group (gloo is enough; NCCL refuses two ranks on one GPU)."""

    backend = "nvshmem"
    interpret = False

    def __init__(self, heap_bytes: int = 1 << 26, timeout: float = BARRIER_TIMEOUT_S):
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise TilecRuntimeError("NvshmemHeap needs torch.distributed initialized first (use spawn() or "
                                    "from_env())")
        rank, world = dist.get_rank(), dist.get_world_size()
        device = _check_gpus(world)
        torch.cuda.set_device(device)  # Triton launches on torch's current device
        torch.empty(1, device=device)  # a CUDA context before NVSHMEM starts (as the probe does)
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.set_backend("NVSHMEM")
        group = dist.group.WORLD.group_name
        try:  # what releases before rendezvous-by-name wanted first (deprecated since: quietly, as the probe does)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                symm_mem.enable_symm_mem_for_group(group)
        except Exception as e:  # noqa: BLE001 - newer torch needs none
            log.debug("enable_symm_mem_for_group: %s", e)
        size = max(int(heap_bytes), 1 << 21)
        arena = symm_mem.empty(size, dtype=torch.uint8, device=device)  # the first and only allocation of every rank
        self._handle = symm_mem.rendezvous(arena, group=group)
        super().__init__(rank, world, arena.device, arena)
        ptrs = list(self._handle.buffer_ptrs)
        if ptrs[rank] != arena.data_ptr():
            raise TilecRuntimeError(f"rank {rank}: symmetric memory's buffer pointer differs from the arena's")
        # a peer NVSHMEM reaches only over the network has no pointer here (0): its entry stays this rank's base,
        # which only kernels of several nodes read for that peer (and then never by pointer)
        self._bases = torch.tensor([p or ptrs[rank] for p in ptrs], dtype=torch.int64, device=device)
        self._destroy_group_on_close = False  # from_env sets it when it made the process group
        self.timeout = timeout

    def heap_bases(self) -> torch.Tensor:
        self._check_open()
        return self._bases

    def barrier(self, tag: int | None = None) -> list[int | None]:
        self._check_open()
        self.finish_gpu_work()  # this rank's queued work is done
        return self.host_barrier(tag)

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        self._bases = None
        try:
            settled = self.gpu_work_settled()
        except Exception as e:  # teardown must not mask the real outcome
            log.warning("rank %d: NVSHMEM heap close: %s", self.rank, e)
            settled = True
        if settled:
            self._handle = None
        else:  # a kernel still reads it: the process's exit reclaims it
            log.warning("rank %d: GPU work still running at the NVSHMEM heap's close: left to the process's exit",
                        self.rank)
        if self._destroy_group_on_close:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
