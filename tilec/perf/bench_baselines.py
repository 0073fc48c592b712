"""What a careful PyTorch user would run instead of tilec, on the bench's own inputs, as ops the harness times.

Each op is (name, kind, note, fn): fn() runs the op once and returns its output in the layout of the tilec
program's output (C, or O), so every row is checked against the first baseline's output. kind is "baseline" (a
fair bar: the best of them gives every row's ratio), "reference" (labelled, never the bar: the naive torch decode,
or a lower bound timed without communication) or "floor" (the physical limit). The harness (tilec.perf.bench,
tilec.perf.bench_decode) captures each op in a CUDA graph where it can and times the replays.

GEMM family (`gemm_ops`; pattern from the program's shapes, `gemm_pattern`):
- floor: cuBLAS alone on the whole problem ([M, K] @ [K, N]) on one GPU.
- ag (All-Gather + GEMM): NCCL all_gather_into_tensor + matmul; PyTorch async-TP (symm_mem.fused_all_gather_matmul)
  eagerly and under torch.compile with micro-pipeline TP on. World 1: matmul on the local A.
- rs (GEMM + Reduce-Scatter): matmul + reduce_scatter_tensor; symm_mem.fused_matmul_reduce_scatter.
- ar (GEMM + All-Reduce): matmul + all_reduce; matmul into symmetric memory + symm_mem one-shot / two-shot
  all-reduce.
Distributed flash decode (`decode_ops`):
- the fastest SDPA backend that returns the log-sum-exp (flash, efficient, cudnn: whichever run here), with GQA
  folded into the query length (q [B, HKV, G, D] against k [B, HKV, S, D]); world 1: that call alone, and
  F.scaled_dot_product_attention (enable_gqa). World > 1: SDPA with LSE, one all_gather_into_tensor of (O, lse)
  packed in one buffer, and the LSE combine: the whole step as one op (captured in a CUDA graph by the harness).
  Ranks sharing one GPU (MPS), where NCCL refuses them: the same step with (O, lse) exchanged through torch's
  symmetric memory over the default (gloo) group instead (each rank writes its partials into its buffer, a device
  barrier, every rank's buffer read, a barrier, the combine), where it can be set up on every rank.
- reference: the same step with attention by plain torch ops (bmm, logsumexp, exp, bmm).
Baselines that cannot run here (no NCCL, no symmetric memory) are left out with a note in the log, not faked.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

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




@dataclass
class Op:
    name: str
    kind: str  # "baseline" | "reference" | "floor"
    note: str
    fn: Callable[[], torch.Tensor]


def time_ops(ops, heap, iters: int, log):
    """Each op that runs here as (op, Timing, its output); one that fails (out of memory, say) is logged and left
    out, and the others still run."""
    from tilec.perf.measure import time_op

    out = []
    for op in ops:
        try:
            result = op.fn()
            out.append((op, time_op(op.fn, heap, iters, 3), result))
        except Exception as e:  # noqa: BLE001
            log(f"  baselines: {op.name} failed: {type(e).__name__}: {str(e)[:160]}")
    return out


def first_baseline(timed) -> torch.Tensor | None:
    """The output every row is checked against when no independent reference is at hand."""
    return next((res for op, _t, res in timed if op.kind == "baseline"), None)


def _symm_mem(grp):
    """torch's symmetric memory for the group, or None where this build or machine has none."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        with warnings.catch_warnings():  # enable_symm_mem_for_group is a no-op that warns on newer torch
            warnings.simplefilter("ignore")
            symm_mem.enable_symm_mem_for_group(grp.group_name)
        return symm_mem
    except Exception:  # noqa: BLE001 - no symmetric memory: those baselines are left out, with a note
        return None


def gemm_floor(a_full: torch.Tensor, b_full: torch.Tensor) -> Op:
    """cuBLAS alone on the whole problem on one GPU: what no distributed schedule can beat."""
    return Op("cublas floor", "floor", f"matmul [{a_full.shape[0]}, {a_full.shape[1]}] @ [{b_full.shape[0]}, "
              f"{b_full.shape[1]}] on one GPU, no communication", lambda: torch.matmul(a_full, b_full))


def gemm_ops(heap, world: int, pattern: str, a: torch.Tensor, b: torch.Tensor, log) -> list[Op]:
    """The baselines of one GEMM-family shape on this rank's inputs: a, b as the program declares A and B (ag:
    A [M/W, K], B [K, N]; rs / ar: A [M, K/W], B [K/W, N]); each op returns C as the program declares it."""
    dev = heap.device
    if world == 1:
        return [Op("cublas", "baseline", "matmul: the whole op at world 1", lambda: torch.matmul(a, b))]
    if not _one_gpu_per_rank(dev, world):
        log(f"  baselines: ranks share {dev}; NCCL and symmetric memory need one GPU per rank: no distributed "
            "baseline is timed")
        if pattern == "ag":
            a_full = torch.cat([a] * world)
            return [Op("matmul (no comm)", "reference", "compute only: a lower bound, not a distributed baseline",
                       lambda: torch.matmul(a_full, b))]
        return [Op("matmul (no comm)", "reference", "compute only: a lower bound, not a distributed baseline",
                   lambda: torch.matmul(a, b))]
    import torch.distributed as dist

    grp = _nccl_group()
    symm_mem = _symm_mem(grp) if dev.type == "cuda" else None
    if symm_mem is None:
        log("  baselines: no symmetric memory here: the PyTorch symmetric-memory baselines are left out")
    m_local, k = a.shape
    n = b.shape[1]
    ops = []
    if pattern == "ag":
        a_full = torch.empty(m_local * world, k, device=dev, dtype=a.dtype)

        def nccl_ag():
            dist.all_gather_into_tensor(a_full, a, group=grp)
            return torch.matmul(a_full, b)

        ops.append(Op("nccl+cublas", "baseline", "all_gather_into_tensor + matmul", nccl_ag))
        if symm_mem is not None:
            a_symm = symm_mem.empty(m_local, k, device=dev, dtype=a.dtype)
            a_symm.copy_(a)

            def async_tp():
                return torch.ops.symm_mem.fused_all_gather_matmul(a_symm, [b], gather_dim=0,
                                                                  group_name=grp.group_name)[1][0]

            ops.append(Op("async-tp", "baseline", "torch.ops.symm_mem.fused_all_gather_matmul (eager)", async_tp))
            compiled = _async_tp_compiled(a_symm, b, grp, log)
            if compiled is not None:
                ops.append(compiled)
    elif pattern == "rs":
        shard = torch.empty(m_local // world, n, device=dev, dtype=a.dtype)

        def nccl_rs():
            dist.reduce_scatter_tensor(shard, torch.matmul(a, b), group=grp)
            return shard

        ops.append(Op("nccl+cublas", "baseline", "matmul + reduce_scatter_tensor", nccl_rs))
        if symm_mem is not None:
            ops.append(Op("fused_matmul_reduce_scatter", "baseline", "torch.ops.symm_mem (eager)",
                          lambda: torch.ops.symm_mem.fused_matmul_reduce_scatter(a, b, "sum", scatter_dim=0,
                                                                                 group_name=grp.group_name)))
    else:
        def nccl_ar():
            c = torch.matmul(a, b)
            dist.all_reduce(c, group=grp)
            return c

        ops.append(Op("nccl+cublas", "baseline", "matmul + all_reduce", nccl_ar))
        if symm_mem is not None:
            c_symm = symm_mem.empty(m_local, n, device=dev, dtype=a.dtype)
            symm_mem.rendezvous(c_symm, grp.group_name)
            for name in ("one_shot_all_reduce", "two_shot_all_reduce_"):
                fn = getattr(torch.ops.symm_mem, name, None)
                if fn is None:
                    continue

                def symm_ar(fn=fn, name=name):
                    torch.matmul(a, b, out=c_symm)
                    out = fn(c_symm, "sum", grp.group_name)
                    return c_symm if name.endswith("_") else out

                ops.append(Op(f"cublas+symm_mem {name.rstrip('_')}", "baseline",
                              "matmul into symmetric memory, then torch's symmetric-memory all-reduce", symm_ar))
    return ops


def _async_tp_compiled(a_symm, b, grp, log) -> Op | None:
    """all_gather + matmul under torch.compile with micro-pipeline TP (inductor rewrites it into
    fused_all_gather_matmul), if this build does it."""
    try:
        import torch._inductor.config as inductor_config
        from torch.distributed._functional_collectives import all_gather_tensor

        inductor_config._micro_pipeline_tp = True

        def ag_mm(x, y):
            return torch.matmul(all_gather_tensor(x, 0, grp), y)

        compiled = torch.compile(ag_mm, fullgraph=True)
        compiled(a_symm, b)
        return Op("async-tp (torch.compile)", "baseline", "all_gather_tensor + matmul compiled with "
                  "_micro_pipeline_tp", lambda: compiled(a_symm, b))
    except Exception as e:  # noqa: BLE001 - a build without it: left out, with a note
        log(f"  baselines: async-TP under torch.compile unavailable: {type(e).__name__}: {str(e)[:160]}")
        return None


# -- flash decode ------------------------------------------------------------------------------------------------


def sdpa_lse_backends(q4: torch.Tensor, kt: torch.Tensor, vt: torch.Tensor) -> dict[str, Callable]:
    """SDPA kernels that return the log-sum-exp, as fn() -> (o [B, HKV, G, D], lse [B, HKV, G] f32), for
    q4 [B, HKV, G, D] (GQA folded into the query length) against kt, vt [B, HKV, S, D]; those that run here
    (their outputs are checked against the whole op with every other row)."""
    aten = torch.ops.aten
    g = q4.shape[2]

    def flash():
        out = aten._scaled_dot_product_flash_attention(q4, kt, vt, 0.0, False, False)
        return out[0], out[1][..., :g]

    def efficient():
        out = aten._scaled_dot_product_efficient_attention(q4, kt, vt, None, True)
        return out[0], out[1][..., :g]

    def cudnn():
        out = aten._scaled_dot_product_cudnn_attention(q4, kt, vt, None, True, 0.0, False, False)
        return out[0], out[1].reshape(out[1].shape[0], out[1].shape[1], -1)[..., :g]

    found = {}
    for name, fn in (("flash", flash), ("efficient", efficient), ("cudnn", cudnn)):
        try:
            o, lse = fn()
            if o.shape == q4.shape and lse.shape == q4.shape[:3]:
                found[name] = fn
        except Exception:  # noqa: BLE001 - this backend does not run here (device, dtype, build)
            continue
    return found


def decode_ops(heap, dims: dict, world: int, q, k, v, lens, layout: str, iters: int, log) -> list[Op]:
    """The decode baselines on this rank's block: q [B, H, D] and lens [B] (the same on every rank), k, v
    [B, S, HKV, D] ("bshd") or [B, HKV, S, D] ("bhsd"); each op returns O [B, H, D] in q's dtype. The bench passes
    full lengths, which SDPA takes without a mask; other lengths get only the torch reference."""
    import torch.nn.functional as F

    b, hkv, grp, d, s = dims["B"], dims["HKV"], dims["G"], dims["D"], dims["S"]
    h = hkv * grp
    dev = heap.device
    n_local = (lens.to(torch.int64) - heap.rank * s).clamp(0, s)
    full = bool((n_local == s).all())
    # SDPA reads [B, HKV, S, D]; a position-major cache is transposed once here, as input preparation
    kt, vt = (k, v) if layout == "bhsd" else (k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous())
    q4 = q.view(b, hkv, grp, d)
    distributed = world > 1 and _one_gpu_per_rank(dev, world)
    if world > 1 and not distributed:
        log(f"  baselines: ranks share {dev}; NCCL needs one GPU per rank: the exchange goes through symmetric "
            "memory where it can")
    best = None
    if full and dev.type == "cuda":
        backends = sdpa_lse_backends(q4, kt, vt)
        timed = {}
        for name, fn in backends.items():  # the fastest on this shape: a short timing of each
            from tilec.perf.gpu_time import cold_time

            timed[name] = cold_time(fn, reps=max(5, iters // 2), warmup=2)
        if timed:
            best = min(timed, key=timed.get)
            log("  sdpa with lse: " + ", ".join(f"{n} {t * 1e6:.1f}us" for n, t in timed.items()) + f"; {best}")
        else:
            log("  baselines: no SDPA backend that returns the log-sum-exp runs here")
    ops = []
    if world == 1:
        if best:
            fn = backends[best]
            ops.append(Op(f"sdpa+lse ({best})", "baseline", "SDPA kernel that returns the lse, GQA folded into the "
                          "query length", lambda: fn()[0].reshape(b, h, d)))
        mask = None if full else (torch.arange(s, device=dev)[None, :] < n_local[:, None])[:, None, None, :]
        q1 = q.unsqueeze(2)
        ops.append(Op("torch sdpa", "baseline", "F.scaled_dot_product_attention, enable_gqa",
                      lambda: F.scaled_dot_product_attention(q1, kt, vt, attn_mask=mask,
                                                             enable_gqa=grp > 1).squeeze(2)))
        return ops
    n_mask = None if full else n_local
    if not distributed:
        ops = [Op("torch attention (local, no comm)", "reference", "compute only: a lower bound, not a distributed "
                  "baseline", lambda: local_attention_lse(q, kt, vt, n_mask, grp)[0].to(q.dtype))]
        shared = _symm_exchange(heap, b * h * (d + 1), log)
        if shared is not None:
            if best:
                ops.append(Op(f"sdpa+lse ({best})+symm_mem", "baseline", "SDPA with lse, (O, lse) exchanged through "
                              "torch symmetric memory (ranks share the GPU: no NCCL), lse combine",
                              shared_step(backends[best], *shared, (b, h, d), q.dtype)))
            ops.append(Op("torch attention+symm_mem", "reference", "naive: bmm, logsumexp, exp, bmm in torch, then "
                          "the exchange through symmetric memory and the lse combine",
                          shared_step(lambda: local_attention_lse(q, kt, vt, n_mask, grp), *shared, (b, h, d),
                                      q.dtype)))
        return ops
    import torch.distributed as dist

    grp_nccl = _nccl_group()
    send = torch.empty(b * h * (d + 1), device=dev, dtype=torch.float32)
    recv = torch.empty(world * b * h * (d + 1), device=dev, dtype=torch.float32)  # flat: every backend takes it
    parts = recv.view(world, b * h * (d + 1))

    def step(local):
        def run():
            o, lse = local()
            send[: b * h * d].copy_(o.reshape(-1))
            send[b * h * d:].copy_(lse.reshape(-1))
            dist.all_gather_into_tensor(recv, send, group=grp_nccl)
            return lse_combine(parts[:, : b * h * d].reshape(world, b, h, d),
                               parts[:, b * h * d:].reshape(world, b, h)).to(q.dtype)
        return run

    if best:
        ops.append(Op(f"sdpa+lse ({best})+nccl", "baseline", "SDPA with lse, one all_gather_into_tensor of (O, lse), "
                      "lse combine", step(backends[best])))
    ops.append(Op("torch attention+nccl", "reference", "naive: bmm, logsumexp, exp, bmm in torch, then "
                  "all_gather_into_tensor and the lse combine", step(lambda: local_attention_lse(q, kt, vt, n_mask,
                                                                                                 grp))))
    return ops


SYMM_BARRIER_TIMEOUT_MS = 10_000  # a device barrier of the exchange that waits this long traps (a hang otherwise)


def _symm_exchange(heap, numel: int, log, dtype: torch.dtype = torch.float32):
    """(this rank's buffer, every rank's buffer by rank, a device barrier over the ranks) of `numel` `dtype` in torch's
    symmetric memory over the default process group (gloo under tilec.runtime.spawn), ranks on one GPU allowed
    (TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES); None off a GPU, or where it could not be set up on every rank."""
    if heap.device.type != "cuda" or heap.world == 1:
        return None
    got = None
    try:
        import os

        import torch.distributed as dist

        os.environ.setdefault("TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES", "1")  # MPS: every rank on cuda:0
        symm_mem = _symm_mem(dist.group.WORLD)
        if symm_mem is None:
            raise RuntimeError("torch.distributed._symmetric_memory is not available for the default group")
        buf = symm_mem.empty(numel, dtype=dtype, device=heap.device)
        hdl = symm_mem.rendezvous(buf, dist.group.WORLD.group_name)
        peers = [hdl.get_buffer(r, (numel,), dtype) for r in range(heap.world)]
        got = (buf, peers, lambda: hdl.barrier(channel=0, timeout_ms=SYMM_BARRIER_TIMEOUT_MS))
    except Exception as e:  # noqa: BLE001 - no symmetric memory here: the baseline is left out, with a note
        log(f"  baselines: no symmetric-memory exchange here: {type(e).__name__}: {str(e)[:200]}")
    if not all(heap.barrier(int(got is not None))):  # on every rank or on none
        return None
    return got


def shared_step(local, mine: torch.Tensor, peers: list[torch.Tensor], barrier, bhd: tuple[int, int, int],
                dtype: torch.dtype):
    """One decode step whose (O, lse) every rank reads from every rank's buffer: local() -> (o [B, H, D],
    lse [B, H]) packed into `mine`, a barrier (all written), all `peers` read into one local tensor, a barrier (all
    read: the next call may overwrite), the lse combine, in `dtype`."""
    b, h, d = bhd
    n = b * h * d

    def run():
        o, lse = local()
        mine[:n].copy_(o.reshape(-1))
        mine[n:].copy_(lse.reshape(-1))
        barrier()
        parts = torch.stack(peers)
        barrier()
        world = len(peers)
        return lse_combine(parts[:, :n].reshape(world, b, h, d), parts[:, n:].reshape(world, b, h)).to(dtype)

    return run
