"""External baselines for All-Gather + GEMM, timed by the same harness as tilec's schedules.

- torch.matmul (cuBLAS) on the gathered A: the compute floor (world 1: the whole op).
- NCCL + cuBLAS (BSP): all_gather_into_tensor then matmul; needs one GPU per rank.
- PyTorch async-TP: torch.ops.symm_mem.fused_all_gather_matmul; needs one GPU per rank and symmetric memory.
Baselines that cannot run here (ranks sharing a GPU, no NCCL) are left out with a note in the log, not faked.
"""

from __future__ import annotations

import sys

import torch

from tilec.reference import TORCH_DTYPE

_groups: dict[str, object] = {}


def _nccl_group():
    import torch.distributed as dist

    if "nccl" not in _groups:
        _groups["nccl"] = dist.new_group(backend="nccl")
    return _groups["nccl"]


def baselines(heap, dims: dict, world: int, dtype: str, iters: int, timer) -> list[tuple[str, float, str]]:
    m, n, k = dims["M"], dims["N"], dims["K"]
    dt = TORCH_DTYPE[dtype]
    dev = heap.device
    g = torch.Generator(device="cpu").manual_seed(1 + heap.rank)
    a_shard = (torch.randn(m // world, k, generator=g) / 8).to(dev, dt)
    b = (torch.randn(k, n, generator=g) / 8).to(dev, dt)
    a_full = torch.empty(m, k, device=dev, dtype=dt)
    out = []
    if world == 1:
        a_full.copy_(a_shard)
        out.append(("torch.matmul", timer(lambda: torch.matmul(a_full, b), heap, iters, 3), "cuBLAS, A local"))
        return out
    distinct = dev.type == "cuda" and world <= torch.cuda.device_count()
    if not distinct:
        print(f"  baselines: ranks share {dev}; NCCL and async-TP need one GPU per rank, so only torch.matmul of"
              " the gathered A is timed", file=sys.stderr)
        out.append(("torch.matmul (no comm)", timer(lambda: torch.matmul(a_full, b), heap, iters, 3),
                    "compute only: a lower bound, not a distributed baseline"))
        return out
    import torch.distributed as dist

    grp = _nccl_group()

    def nccl_bsp():
        dist.all_gather_into_tensor(a_full, a_shard, group=grp)
        return torch.matmul(a_full, b)

    out.append(("nccl+cublas (bsp)", timer(nccl_bsp, heap, iters, 3), "all_gather_into_tensor + matmul"))
    try:
        import torch.distributed._symmetric_memory as symm_mem

        symm_mem.enable_symm_mem_for_group(grp.group_name)
        a_symm = symm_mem.empty(m // world, k, device=dev, dtype=dt)
        a_symm.copy_(a_shard)

        def async_tp():
            return torch.ops.symm_mem.fused_all_gather_matmul(a_symm, [b], gather_dim=0, group_name=grp.group_name)

        out.append(("pytorch async-tp", timer(async_tp, heap, iters, 3), "fused_all_gather_matmul"))
    except Exception as e:  # not every build has symmetric memory; say so instead of failing the run
        print(f"  baselines: async-TP unavailable: {type(e).__name__}: {str(e)[:160]}", file=sys.stderr)
    return out
