"""External baselines, timed by the same harness as tilec's schedules.

GEMM programs (`baselines`), by pattern (`gemm_pattern`: read off the program's tensor shapes):
- ag (All-Gather + GEMM, A [M/W, K]), rs (GEMM + Reduce-Scatter, A [M, K/W], C [M/W, N]),
  ar (GEMM + All-Reduce, A [M, K/W], C [M, N]).
- rs: matmul + reduce_scatter_tensor (NCCL), and PyTorch's fused_matmul_reduce_scatter (symmetric memory).
- ar: matmul + all_reduce (NCCL).
All-Gather + GEMM:
- torch.matmul (cuBLAS) on the gathered A: the compute floor (world 1: the whole op).
- NCCL + cuBLAS (BSP): all_gather_into_tensor then matmul; needs one GPU per rank.
- PyTorch async-TP: torch.ops.symm_mem.fused_all_gather_matmul; needs one GPU per rank and symmetric memory.
Distributed flash decode (`decode_baselines`):
- world 1: torch.nn.functional.scaled_dot_product_attention (q [B, H, 1, D], k/v [B, HKV, S, D], enable_gqa).
- world > 1: NCCL + torch: local attention by torch ops returning (o, lse) (matmul, logsumexp), one
  all_gather_into_tensor of (o, lse), then the LSE combine in torch; needs one GPU per rank.
Layout changes (the KV transpose to [B, HKV, S, D]) are input preparation, outside the timed region.
Baselines that cannot run here (ranks sharing a GPU, no NCCL) are left out with a note in the log, not faked.
"""

from __future__ import annotations

import math
import sys

import torch

from tilec.reference import TORCH_DTYPE

_groups: dict[str, object] = {}


def _nccl_group():
    import torch.distributed as dist

    if "nccl" not in _groups:
        _groups["nccl"] = dist.new_group(backend="nccl")
    return _groups["nccl"]


def gemm_pattern(path: str, world: int, dims: dict) -> str:
    """'ag', 'rs' or 'ar' from the shapes of the program's A and C (dims bound as for the benchmark row)."""
    from tilec.frontend.parser import parse_file
    from tilec.frontend.sema import check

    prog = check(parse_file(path), world, dims)
    shape = {t.name: t.shape for t in prog.tensors}
    m, n, k = dims["M"], dims["N"], dims["K"]
    if shape.get("A") == (m, k // world) and world > 1:
        return "rs" if shape.get("C") == (m // world, n) else "ar"
    return "ag"


def baselines(heap, dims: dict, world: int, dtype: str, iters: int, timer, pattern: str = "ag"
              ) -> list[tuple[str, float, str]]:
    if pattern in ("rs", "ar") and world > 1:
        return _reduce_baselines(heap, dims, world, dtype, iters, timer, pattern)
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
    if not _one_gpu_per_rank(dev, world):
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


# -- flash decode ------------------------------------------------------------------------------------------------


_OUT_DTYPE: dict[tuple[str, torch.dtype], bool] = {}  # (device type, dtype) -> torch.bmm(..., out_dtype=) works


def _bmm_f32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b with f32 results (f16/bf16 inputs, f32 accumulation, no rounding of the product to 16 bits) where
    torch has bmm(..., out_dtype=) for the device, else the product in the inputs' dtype, widened."""
    key = (a.device.type, a.dtype)
    if a.dtype != torch.float32 and _OUT_DTYPE.get(key, True):
        try:
            out = torch.bmm(a, b, out_dtype=torch.float32)
            _OUT_DTYPE[key] = True
            return out
        except Exception:  # not every build/device has aten::bmm.dtype: fall back, once
            _OUT_DTYPE[key] = False
    return torch.bmm(a, b).float()


def local_attention_lse(q: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor, n_local: torch.Tensor | None,
                        groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of q [B, H, D] over this rank's block kt/vt [B, HKV, S, D] (H = HKV * groups); positions
    >= n_local[b] are masked (None: all valid) and must hold finite values (the dense P.V multiplies them by 0; the
    bench's caches are random). Returns o [B, H, D] f32 and lse [B, H] f32; an empty block gives
    o = 0 and lse = -inf."""
    b, h, d = q.shape
    hkv, s = kt.shape[1], kt.shape[2]
    qg = q.reshape(b * hkv, groups, d)
    scores = _bmm_f32(qg, kt.reshape(b * hkv, s, d).transpose(1, 2)).mul_(1.0 / math.sqrt(d))  # [B*HKV, G, S]
    if n_local is not None:
        pos = torch.arange(s, device=q.device)
        keep = (pos[None, :] < n_local[:, None]).repeat_interleave(hkv, 0)  # [B*HKV, S]
        scores.masked_fill_(~keep[:, None, :], float("-inf"))
    lse = torch.logsumexp(scores, -1)  # [B*HKV, G]
    p = torch.exp(scores.sub_(torch.where(torch.isinf(lse), 0.0, lse)[..., None]))
    o = _bmm_f32(p.to(vt.dtype), vt.reshape(b * hkv, s, d))  # [B*HKV, G, D]
    return o.view(b, h, d), lse.view(b, h)


def lse_combine(o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Merge per-rank partials o [W, B, H, D], lse [W, B, H] into [B, H, D] (f32); all-empty gives 0."""
    big = lse.max(0).values
    w = torch.exp(lse - torch.where(torch.isinf(big), 0.0, big)[None])
    den = w.sum(0)
    return (w[..., None] * o).sum(0) / torch.where(den == 0, 1.0, den)[..., None]


def _one_gpu_per_rank(dev, world: int) -> bool:
    return dev.type == "cuda" and world <= torch.cuda.device_count()


def _reduce_baselines(heap, dims: dict, world: int, dtype: str, iters: int, timer, pattern: str):
    """GEMM + Reduce-Scatter / All-Reduce: each rank multiplies its K-shard, then NCCL reduces (BSP)."""
    m, n, k = dims["M"], dims["N"], dims["K"]
    dt = TORCH_DTYPE[dtype]
    dev = heap.device
    g = torch.Generator(device="cpu").manual_seed(1 + heap.rank)
    a = (torch.randn(m, k // world, generator=g) / 8).to(dev, dt)
    b = (torch.randn(k // world, n, generator=g) / 8).to(dev, dt)
    out = []
    if not _one_gpu_per_rank(dev, world):
        print(f"  baselines: ranks share {dev}; NCCL needs one GPU per rank, so only the local matmul is timed",
              file=sys.stderr)
        out.append(("torch.matmul (no comm)", timer(lambda: torch.matmul(a, b), heap, iters, 3),
                    "compute only: a lower bound, not a distributed baseline"))
        return out
    import torch.distributed as dist

    grp = _nccl_group()
    if pattern == "rs":
        shard = torch.empty(m // world, n, device=dev, dtype=dt)
        out.append(("nccl+cublas (bsp)", timer(lambda: dist.reduce_scatter_tensor(shard, a @ b, group=grp), heap,
                                               iters, 3), "matmul + reduce_scatter_tensor"))
        try:
            import torch.distributed._symmetric_memory as symm_mem

            symm_mem.enable_symm_mem_for_group(grp.group_name)

            def fused():
                return torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", scatter_dim=0,
                                                                      group_name=grp.group_name)

            out.append(("pytorch fused_matmul_reduce_scatter", timer(fused, heap, iters, 3), "symmetric memory"))
        except Exception as e:  # not every build has it; say so instead of failing the run
            print(f"  baselines: fused_matmul_reduce_scatter unavailable: {type(e).__name__}: {str(e)[:160]}",
                  file=sys.stderr)
    else:
        out.append(("nccl+cublas (bsp)", timer(lambda: dist.all_reduce(a @ b, group=grp), heap, iters, 3),
                    "matmul + all_reduce"))
    return out


def decode_baselines(heap, dims: dict, world: int, dtype: str, iters: int, timer, q, k, v, lens,
                     log=None, layout: str = "bshd") -> list[tuple[str, float, str, torch.Tensor | None]]:
    """(name, seconds, note, output O [B, H, D] or None) per baseline that runs here. q [B, H, D] and lens [B]
    are the same on every rank, k/v this rank's block, [B, S, HKV, D] (layout "bshd") or [B, HKV, S, D]
    ("bhsd"); lens are taken as given (the bench passes full lengths)."""
    import torch.nn.functional as F

    log = log or (lambda msg: print(msg, file=sys.stderr))
    b, hkv, grp, d, s = dims["B"], dims["HKV"], dims["G"], dims["D"], dims["S"]
    dev = heap.device
    n_local = (lens.to(torch.int64) - heap.rank * s).clamp(0, s)
    full = bool((n_local == s).all())
    # sdpa reads [B, HKV, S, D]; a position-major cache is transposed once here, outside the timed calls
    kt, vt = (k, v) if layout == "bhsd" else (k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())
    out = []
    if world == 1 or not _one_gpu_per_rank(dev, world):
        q4 = q.unsqueeze(2)  # [B, H, 1, D]
        mask = None if full else (torch.arange(s, device=dev)[None, :] < n_local[:, None])[:, None, None, :]

        def sdpa():
            return F.scaled_dot_product_attention(q4, kt, vt, attn_mask=mask, enable_gqa=grp > 1)

        name, note = "torch sdpa", "scaled_dot_product_attention, enable_gqa, k/v [B, HKV, S, D]"
        if world > 1:
            log(f"  baselines: ranks share {dev}; NCCL needs one GPU per rank, so only the local block's sdpa is"
                " timed")
            name, note = "torch sdpa (local, no comm)", "compute only: a lower bound, not a distributed baseline"
        try:
            secs = timer(sdpa, heap, iters, 3)
            out.append((name, secs, note, sdpa().squeeze(2) if world == 1 else None))
        except Exception as e:  # e.g. out of memory: say so, time the others
            log(f"  baselines: {name} failed: {type(e).__name__}: {str(e)[:160]}")
        return out
    import torch.distributed as dist

    grp_nccl = _nccl_group()
    h = hkv * grp
    n_mask = None if full else n_local
    send = torch.empty(b * h * (d + 1), device=dev, dtype=torch.float32)
    recv = torch.empty(world * b * h * (d + 1), device=dev, dtype=torch.float32)  # flat: every backend takes it
    parts = recv.view(world, b * h * (d + 1))

    def nccl_decode():
        o, lse = local_attention_lse(q, kt, vt, n_mask, grp)
        send[: b * h * d].copy_(o.view(-1))
        send[b * h * d :].copy_(lse.view(-1))
        dist.all_gather_into_tensor(recv, send, group=grp_nccl)
        return lse_combine(parts[:, : b * h * d].reshape(world, b, h, d),
                           parts[:, b * h * d :].reshape(world, b, h)).to(q.dtype)

    try:
        secs = timer(nccl_decode, heap, iters, 3)
        out.append(("nccl+torch (bsp)", secs, "torch attention with lse, all_gather_into_tensor, lse combine",
                    nccl_decode()))
    except Exception as e:
        log(f"  baselines: nccl+torch failed: {type(e).__name__}: {str(e)[:160]}")
    return out
