"""What launching a module of several nodes (backend nvshmem, RANKS_PER_NODE < WORLD) adds to runtime/launch.py: the
heap-base table its device functions read (tilec/device_nvshmem.py) and NVSHMEM's device library linked into its
kernels. Imports only torch (and, for the library, torch's NVSHMEM support), so the CPU emulation uses it too.
"""

from __future__ import annotations

import torch


def node_bases(bases: torch.Tensor, rank: int, per_node: int) -> torch.Tensor:
    """The 2 * world table of a module of several nodes (tilec/device_nvshmem.py): entry p < world is p's base
    where p is on this rank's node, else this rank's own (a peer offset of 0: the address stays symmetric, NVSHMEM
    translates it); entry world + p is p's base as this process maps it (what the CPU emulation copies through)."""
    world = bases.numel()
    node = torch.arange(world, device=bases.device) // per_node
    near = torch.where(node == rank // per_node, bases, bases[rank])
    return torch.cat([near, bases]).contiguous()


def extern_libs(kernel_names: list) -> dict:
    """The `extern_libs` launch option of kernels that call NVSHMEM device functions, as the torch at hand wants it:
    `enable_triton()` (torch 2.11, as the GPU probe of docs/GPU.md launches), or the device library plus the
    kernel registered for NVSHMEM's module initialization (newer torch's `requires_nvshmem` does that)."""
    import torch.distributed._symmetric_memory._nvshmem_triton as nv

    hook = getattr(nv, "_nvshmem_init_hook", None)
    if not hasattr(nv, "requires_nvshmem") or hook is None:
        return nv.enable_triton()
    import triton

    for k in kernel_names:
        nv.NvshmemKernelRegistry.register(getattr(getattr(k, "fn", k), "__name__", str(k)))
    triton.knobs.runtime.jit_post_compile_hook = hook
    return {"libnvshmem_device": nv.NvshmemLibFinder.find_device_library()}
