"""A Llama-style tensor-parallel MLP block and a TP flash-decode step built from tilec ops (issue 21).

MLP (sequence-parallel in and out, rows of the activations split over the ranks):
    h   = ag_gemm(rmsnorm(x_shard), W_gate_up[:, this rank's columns])   # All-Gather + GEMM:  [T, 2*I/W]
    a   = silu(h_gate) * h_up                                          # SwiGLU in torch:    [T, I/W]
    out = x_shard + gemm_rs(a, W_down[this rank's rows, :])            # GEMM + Reduce-Scatter: [T/W, H]
Decode attention: one new token per sequence over a KV cache split along the sequence (examples/flash_decode.tile).

Script mode runs a few layers and compares with the unsharded model (max error) and with plain torch TP (matmul +
collectives); on GPUs it also reports time per layer and tokens/s:
    python examples/tp_block.py --world 2 --backend cpu          # spawns 2 CPU ranks (Triton interpreter)
    torchrun --nproc-per-node 2 examples/tp_block.py --hidden 4096 --inter 14336 --tokens 4096 --compile
Under torchrun the script adopts torchrun's process group (tilec.runtime.from_process_group): no tilec launcher.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import tilec

EXAMPLES = Path(__file__).resolve().parent


def _ops(dtype: torch.dtype):
    """The three programs as torch ops (tilec::tp_ag_gemm, ...); every dim follows the inputs."""
    retype = {"f16": "bf16"} if dtype == torch.bfloat16 else None
    sfx = "_bf16" if retype else ""
    return (tilec.op(EXAMPLES / "ag_gemm.tile", name="tp_ag_gemm" + sfx, retype=retype),
            tilec.op(EXAMPLES / "gemm_rs.tile", name="tp_gemm_rs" + sfx, retype=retype),
            tilec.op(EXAMPLES / "flash_decode.tile", name="tp_flash_decode" + sfx, retype=retype))


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


class MLPWeights:
    """One layer's unsharded weights (the reference model's) and their shards."""

    def __init__(self, hidden: int, inter: int, gen: torch.Generator, dtype: torch.dtype):
        self.norm = 1 + 0.1 * torch.randn(hidden, generator=gen)
        self.gate = torch.randn(hidden, inter, generator=gen) / math.sqrt(hidden)
        self.up = torch.randn(hidden, inter, generator=gen) / math.sqrt(hidden)
        self.down = torch.randn(inter, hidden, generator=gen) / math.sqrt(inter)
        self.dtype = dtype

    def shard(self, rank: int, world: int, device) -> dict[str, torch.Tensor]:
        cols = slice(rank * self.gate.shape[1] // world, (rank + 1) * self.gate.shape[1] // world)
        to = dict(dtype=self.dtype, device=device)
        return {"norm": self.norm.to(**to), "gate_up": torch.cat([self.gate[:, cols], self.up[:, cols]], 1).to(**to),
                "down": self.down[cols].to(**to).contiguous()}


class TPMLP(nn.Module):
    """x_shard [T/W, H] -> x_shard + MLP(rmsnorm(x)) rows of this rank, through tilec::ag_gemm / tilec::gemm_rs."""

    def __init__(self, w: MLPWeights, rank: int, world: int, device):
        super().__init__()
        for k, v in w.shard(rank, world, device).items():
            self.register_buffer(k, v)
        self.ag_gemm, self.gemm_rs, _ = _ops(w.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ag_gemm(rmsnorm(x, self.norm), self.gate_up)
        gate, up = h.chunk(2, dim=1)
        return x + self.gemm_rs((F.silu(gate.float()) * up.float()).to(x.dtype), self.down)


class TorchTPMLP(TPMLP):
    """The same block with plain torch TP: all-gather, matmul, SwiGLU, matmul, reduce-scatter (NCCL on GPUs; gloo,
    which has no reduce-scatter, all-reduces and keeps its rows)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        world, rank = dist.get_world_size(), dist.get_rank()
        xs = rmsnorm(x, self.norm)
        full = torch.empty((x.shape[0] * world, x.shape[1]), dtype=x.dtype, device=x.device)
        getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(full, xs)
        gate, up = (full @ self.gate_up).chunk(2, dim=1)
        part = (F.silu(gate.float()) * up.float()).to(x.dtype) @ self.down
        if part.is_cuda:
            out = torch.empty_like(x)
            getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(out, part)
        else:
            part32 = part.float()
            dist.all_reduce(part32)
            out = part32.chunk(world)[rank].to(x.dtype)
        return x + out


def reference_mlp(x: torch.Tensor, layers: list[MLPWeights]) -> torch.Tensor:
    """The unsharded model in f32."""
    x = x.float()
    for w in layers:
        xs = rmsnorm(x, w.norm)
        x = x + (F.silu(xs @ w.gate) * (xs @ w.up)) @ w.down
    return x


class TPDecodeAttention(nn.Module):
    """One decode step: q [B, HKV*G, D] (every rank the same) attends to this rank's block of the KV cache
    ([B, HKV, S, D], positions rank*S ...), lens [B] the sequences' lengths; through tilec::flash_decode."""

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor):
        super().__init__()
        self.register_buffer("k", k_cache)
        self.register_buffer("v", v_cache)
        *_, self.flash_decode = _ops(k_cache.dtype)

    def forward(self, q: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        return self.flash_decode(q, self.k, self.v, lens)


def torch_tp_decode(q, k, v, lens, rank: int, world: int) -> torch.Tensor:
    """Plain torch TP: local attention over this rank's block with its log-sum-exp, all-gather, combine."""
    b, hq, d = q.shape
    hkv, s = k.shape[1], k.shape[2]
    kk = k.float().repeat_interleave(hq // hkv, dim=1)  # [B, HQ, S, D]
    vv = v.float().repeat_interleave(hq // hkv, dim=1)
    scores = torch.einsum("bhd,bhsd->bhs", q.float(), kk) / math.sqrt(d)
    pos = rank * s + torch.arange(s, device=q.device)
    scores = scores.masked_fill(pos[None, None, :] >= lens[:, None, None], float("-inf"))
    lse = torch.logsumexp(scores, -1)  # -inf where this rank holds none of the sequence
    o = torch.einsum("bhs,bhsd->bhd", torch.exp(scores - lse[..., None]).nan_to_num(0.0), vv)
    os_, ls = [torch.empty_like(o) for _ in range(world)], [torch.empty_like(lse) for _ in range(world)]
    dist.all_gather(os_, o.contiguous())
    dist.all_gather(ls, lse.contiguous())
    ls_t = torch.stack(ls)  # [W, B, HQ]
    wts = torch.softmax(ls_t, 0).nan_to_num(0.0)
    return (wts[..., None] * torch.stack(os_)).sum(0).to(q.dtype)


def reference_decode(q, k_full, v_full, lens) -> torch.Tensor:
    b, hq, d = q.shape
    kk = k_full.float().repeat_interleave(hq // k_full.shape[1], dim=1)
    vv = v_full.float().repeat_interleave(hq // k_full.shape[1], dim=1)
    mask = torch.arange(k_full.shape[2])[None, None, :] < lens[:, None, None].cpu()
    out = F.scaled_dot_product_attention(q.float().cpu()[:, :, None], kk.cpu(), vv.cpu(),
                                         attn_mask=mask[:, :, None].expand(b, hq, 1, -1))
    return out[:, :, 0]


# -- script mode --------------------------------------------------------------------------------------------------


def heap_bytes(cfg: dict, world: int) -> int:
    """The symmetric heap the ops of this model need (their buffers, flags and staging), plus slack."""
    ag, rs, fd = _ops(_dtype(cfg))
    t, h, i = cfg["tokens"], cfg["hidden"], cfg["inter"]
    need = ag.heap_bytes(world, M=t, N=2 * i // world, K=h) + rs.heap_bytes(world, M=t, N=h, K=i)
    need += fd.heap_bytes(world, B=cfg["batch"], HKV=cfg["kv_heads"], G=cfg["group"], D=cfg["head_dim"],
                          S=cfg["seq"] // world)
    return need + (1 << 20)


def _dtype(cfg: dict) -> torch.dtype:
    return {"f16": torch.float16, "bf16": torch.bfloat16}[cfg["dtype"]]


def _time(fn, iters: int, device) -> float:
    """Seconds per call (CUDA events on GPUs; wall clock on the CPU emulation, where it says little)."""
    fn()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def run(heap, cfg: dict) -> dict:
    """One rank of the comparison: MLP layers (tilec, plain TP, unsharded) and a decode step. Returns max errors
    and, on GPUs, times."""
    rank, world, device = heap.rank, heap.world, heap.device
    dtype = _dtype(cfg)
    gen = torch.Generator().manual_seed(cfg["seed"])
    t, h = cfg["tokens"], cfg["hidden"]
    layers = [MLPWeights(h, cfg["inter"], gen, dtype) for _ in range(cfg["layers"])]
    x = torch.randn(t, h, generator=gen)
    tp = nn.Sequential(*(TPMLP(w, rank, world, device) for w in layers))
    plain = nn.Sequential(*(TorchTPMLP(w, rank, world, device) for w in layers))
    if cfg["compile"]:
        backend = "inductor" if device.type == "cuda" else "eager"
        tp = torch.compile(tp, backend=backend, fullgraph=True)
    x_shard = x.to(dtype).chunk(world)[rank].to(device).contiguous()
    want = reference_mlp(x.to(dtype), layers).chunk(world)[rank]
    with torch.no_grad():
        got, base = tp(x_shard), plain(x_shard)
    out = {"mlp_err": float((got.float().cpu() - want).abs().max()),
           "plain_err": float((base.float().cpu() - want).abs().max()), "scale": float(want.abs().max())}

    b, hkv, g, d, seq = cfg["batch"], cfg["kv_heads"], cfg["group"], cfg["head_dim"], cfg["seq"]
    k_full = torch.randn(b, hkv, seq, d, generator=gen).to(dtype)
    v_full = torch.randn(b, hkv, seq, d, generator=gen).to(dtype)
    q = torch.randn(b, hkv * g, d, generator=gen).to(dtype)
    lens = torch.randint(1, seq + 1, (b,), generator=gen, dtype=torch.int32)
    s = seq // world
    attn = TPDecodeAttention(k_full[:, :, rank * s:(rank + 1) * s].to(device).contiguous(),
                             v_full[:, :, rank * s:(rank + 1) * s].to(device).contiguous())
    want_o = reference_decode(q, k_full, v_full, lens)
    qd, ld = q.to(device), lens.to(device)
    with torch.no_grad():
        o = attn(qd, ld)
        o_plain = torch_tp_decode(qd, attn.k, attn.v, ld, rank, world)
    out["decode_err"] = float((o.float().cpu() - want_o).abs().max())
    out["decode_plain_err"] = float((o_plain.float().cpu() - want_o).abs().max())
    if cfg["iters"]:
        with torch.no_grad():
            n = cfg["layers"]
            out["tilec_layer_s"] = _time(lambda: tp(x_shard), cfg["iters"], device) / n
            out["plain_layer_s"] = _time(lambda: plain(x_shard), cfg["iters"], device) / n
            out["tilec_decode_s"] = _time(lambda: attn(qd, ld), cfg["iters"], device)
            out["plain_decode_s"] = _time(lambda: torch_tp_decode(qd, attn.k, attn.v, ld, rank, world),
                                          cfg["iters"], device)
    return out


def report(res: dict, cfg: dict, world: int) -> str:
    lines = [f"TP MLP x{cfg['layers']} (T={cfg['tokens']} H={cfg['hidden']} I={cfg['inter']} {cfg['dtype']}, world "
             f"{world}): max |err| vs unsharded: tilec {res['mlp_err']:.3g}, plain TP {res['plain_err']:.3g} "
             f"(max |out| {res['scale']:.3g})",
             f"TP decode (B={cfg['batch']} HKV={cfg['kv_heads']} G={cfg['group']} D={cfg['head_dim']} "
             f"seq={cfg['seq']}): max |err| vs unsharded: tilec {res['decode_err']:.3g}, plain TP "
             f"{res['decode_plain_err']:.3g}"]
    if "tilec_layer_s" in res:
        toks = cfg["tokens"]
        for who in ("tilec", "plain"):
            lines.append(f"{who:>5}: {res[f'{who}_layer_s'] * 1e6:10.1f} us/layer  "
                         f"{toks / (res[f'{who}_layer_s'] * cfg['layers']):12.0f} tokens/s (prefill, {cfg['layers']}"
                         f" layers)   decode step {res[f'{who}_decode_s'] * 1e6:10.1f} us "
                         f"{cfg['batch'] / res[f'{who}_decode_s']:10.0f} tokens/s")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2, help="ranks to spawn when not under torchrun (default 2)")
    ap.add_argument("--backend", default="auto", choices=("auto", "cpu", "iris"),
                    help="cpu: the CPU emulation; iris: GPUs (default: iris where a GPU is)")
    ap.add_argument("--hidden", type=int, default=64, help="model width H (Llama-3-8B: 4096, 70B: 8192)")
    ap.add_argument("--inter", type=int, default=128, help="MLP width I (8B: 14336, 70B: 28672)")
    ap.add_argument("--tokens", type=int, default=64, help="prefill tokens T (a multiple of the world size)")
    ap.add_argument("--layers", type=int, default=2, help="MLP layers (default 2)")
    ap.add_argument("--batch", type=int, default=2, help="decode batch (sequences)")
    ap.add_argument("--kv-heads", type=int, default=2, help="KV heads")
    ap.add_argument("--group", type=int, default=2, help="query heads per KV head (GQA)")
    ap.add_argument("--head-dim", type=int, default=64, help="head dim")
    ap.add_argument("--seq", type=int, default=128, help="KV cache positions over all ranks (a multiple of the "
                    "world size)")
    ap.add_argument("--dtype", default="f16", choices=("f16", "bf16"), help="activations and weights (default f16)")
    ap.add_argument("--compile", action="store_true", help="the tilec model under torch.compile(fullgraph=True) "
                    "(eager backend on the CPU, inductor on GPUs)")
    ap.add_argument("--iters", type=int, default=0, help="timed calls (0: none; times only mean anything on GPUs)")
    ap.add_argument("--seed", type=int, default=0, help="weights and inputs")
    return ap.parse_args(argv)


def _config(a: argparse.Namespace) -> dict:
    return {"hidden": a.hidden, "inter": a.inter, "tokens": a.tokens, "layers": a.layers, "batch": a.batch,
            "kv_heads": a.kv_heads, "group": a.group, "head_dim": a.head_dim, "seq": a.seq, "dtype": a.dtype,
            "compile": a.compile, "iters": a.iters, "seed": a.seed}


def main(argv=None) -> int:
    a = parse_args(argv)
    cfg = _config(a)
    if tilec.runtime.under_torchrun():  # adopt torchrun's group: no tilec launcher
        backend = tilec.runtime.default_backend() if a.backend == "auto" else a.backend
        world = int(os.environ["WORLD_SIZE"])
        if backend == "cpu":
            os.environ["TRITON_INTERPRET"] = "1"
        pg = "gloo" if backend == "cpu" else "cpu:gloo,cuda:nccl"
        if backend != "cpu":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count())
        dist.init_process_group(pg)
        try:
            heap = tilec.runtime.from_process_group(backend=backend, heap_bytes=heap_bytes(cfg, world))
            try:
                res = run(heap, cfg)
                if heap.rank == 0:
                    print(report(res, cfg, world), flush=True)
            finally:
                heap.close()
        finally:
            dist.barrier()  # no rank tears the group down while a peer's last collective is still in flight
            dist.destroy_process_group()
        return 0
    backend = a.backend if a.backend != "auto" else tilec.runtime.default_backend()
    results = tilec.runtime.spawn(run, a.world, backend=backend, heap_bytes=heap_bytes(cfg, a.world),
                                  args=(cfg,))
    print(report(results[0], cfg, a.world))
    return 0


if __name__ == "__main__":
    sys.exit(main())
