"""A Llama-style tensor-parallel MLP block and a TP flash-decode step built from tilec ops.

MLP (sequence-parallel in and out, rows of the activations split over the ranks):
    h   = ag_gemm(rmsnorm(x_shard), W_gate_up[:, this rank's columns])   # All-Gather + GEMM:  [T, 2*I/W]
    a   = silu(h_gate) * h_up                                          # SwiGLU in torch:    [T, I/W]
    out = x_shard + gemm_rs(a, W_down[this rank's rows, :])            # GEMM + Reduce-Scatter: [T/W, H]
Decode attention: one new token per sequence over a KV cache split along the sequence (examples/flash_decode.tile).

Script mode runs a few layers and a decode step as several variants, each against the unsharded model (max error)
and, with --iters, timed with CUDA events after 3 warmup calls (time per layer, tokens/s): tilec (eager; with
--compile also under torch.compile), plain torch TP (cuBLAS matmuls + NCCL collectives over a group of its own), and on
GPUs the CUDA-graph form of each eager variant (-graph) and PyTorch async-TP (torch.compile with inductor's
micro-pipeline TP, world > 1). --out saves every variant's numbers as JSON.
    python examples/tp_block.py --world 2 --backend cpu          # spawns 2 CPU ranks (Triton interpreter)
    python examples/tp_block.py --world 1 --backend iris --hidden 4096 --inter 14336 --tokens 4096 --dtype bf16 \
        --iters 10 --out /tmp/tp.json
    torchrun --nproc-per-node 2 examples/tp_block.py --hidden 4096 --inter 14336 --tokens 4096 --dtype bf16 \
        --compile --iters 10 --out /tmp/tp_w2.json
Under torchrun the script adopts torchrun's process group (tilec.runtime.from_process_group): no tilec launcher.
Spawned ranks that share one GPU (--world 2 on one GPU) cannot use NCCL: plain TP then runs over gloo (noted).
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
from tilec.errors import TilecError

EXAMPLES = Path(__file__).resolve().parent


def _on_gpu() -> bool:
    try:
        return tilec.runtime.active_heap().device.type == "cuda"
    except TilecError:  # sizing the heap before the ranks start: the GPU's ops if there is one
        return torch.cuda.is_available()


def _ops(dtype: torch.dtype, barrier: str = "auto"):
    """The three programs as torch ops (tilec::tp_ag_gemm, ...); every dim follows the inputs. barrier: "auto" (host
    barriers, device ones inside a CUDA graph capture) or "device" (device barriers always; tilec.op's barrier=)."""
    retype = {"f16": "bf16"} if dtype == torch.bfloat16 else None
    sfx = ("_bf16" if retype else "") + ("_devbar" if barrier == "device" else "")
    gemm = {}
    if _on_gpu():  # the .tile defaults (64x64x32 tiles) suit the emulation
        # the first of `tilec bench`'s Hopper configs (perf/bench.py CONFIGS); `tilec bench` tunes per shape
        gemm = {"dims": {"BM": 128, "BN": 256, "BK": 64}, "num_warps": 8, "num_stages": 3, "group_m": 8}
        sfx += "_h"
    return (tilec.op(EXAMPLES / "ag_gemm.tile", name="tp_ag_gemm" + sfx, retype=retype, barrier=barrier, **gemm),
            tilec.op(EXAMPLES / "gemm_rs.tile", name="tp_gemm_rs" + sfx, retype=retype, barrier=barrier, **gemm),
            tilec.op(EXAMPLES / "flash_decode.tile", name="tp_flash_decode" + sfx, retype=retype, barrier=barrier))


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


def swiglu(h: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of h = [gate | up], in the activations' dtype (as Llama implementations do)."""
    gate, up = h.chunk(2, dim=1)
    return F.silu(gate) * up


class TPMLP(nn.Module):
    """x_shard [T/W, H] -> x_shard + MLP(rmsnorm(x)) rows of this rank, through tilec::ag_gemm / tilec::gemm_rs."""

    def __init__(self, w: MLPWeights, rank: int, world: int, device, barrier: str = "auto"):
        super().__init__()
        for k, v in w.shard(rank, world, device).items():
            self.register_buffer(k, v)
        self.ag_gemm, self.gemm_rs, _ = _ops(w.dtype, barrier)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gemm_rs(swiglu(self.ag_gemm(rmsnorm(x, self.norm), self.gate_up)), self.down)


class TorchTPMLP(nn.Module):
    """The same block with plain torch TP: all-gather, matmul (cuBLAS), SwiGLU, matmul, reduce-scatter, over
    `group` (NCCL on GPUs; gloo, which has no reduce-scatter, all-reduces and keeps its rows)."""

    def __init__(self, w: MLPWeights, rank: int, world: int, device, group=None, comm: str = "nccl"):
        super().__init__()
        for k, v in w.shard(rank, world, device).items():
            self.register_buffer(k, v)
        self.group, self.rank, self.world, self.comm = group, rank, world, comm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xs = rmsnorm(x, self.norm)
        full = torch.empty((x.shape[0] * self.world, x.shape[1]), dtype=x.dtype, device=x.device)
        getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(full, xs, group=self.group)
        part = swiglu(full @ self.gate_up) @ self.down
        if self.comm == "nccl":
            out = torch.empty_like(x)
            getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)(out, part, group=self.group)
        else:
            part32 = part.float()
            dist.all_reduce(part32, group=self.group)
            out = part32.chunk(self.world)[self.rank].to(x.dtype)
        return x + out


class AsyncTPMLP(TorchTPMLP):
    """Plain TP written with functional collectives, for PyTorch's async-TP: under torch.compile with
    torch._inductor.config._micro_pipeline_tp (and symmetric memory enabled for the group) inductor rewrites
    all-gather + matmul and matmul + reduce-scatter into the fused, overlapped symm_mem ops."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.distributed import _functional_collectives as funcol

        full = funcol.all_gather_tensor(rmsnorm(x, self.norm), 0, self.group)
        part = swiglu(full @ self.gate_up) @ self.down
        return x + funcol.reduce_scatter_tensor(part, "sum", 0, self.group)


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

    def __init__(self, k_cache: torch.Tensor, v_cache: torch.Tensor, barrier: str = "auto"):
        super().__init__()
        self.register_buffer("k", k_cache)
        self.register_buffer("v", v_cache)
        *_, self.flash_decode = _ops(k_cache.dtype, barrier)

    def forward(self, q: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        return self.flash_decode(q, self.k, self.v, lens)


def torch_tp_decode(q, k, v, lens, rank: int, world: int, group=None) -> torch.Tensor:
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
    dist.all_gather(os_, o.contiguous(), group=group)
    dist.all_gather(ls, lse.contiguous(), group=group)
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
    ag, rs, fd = _ops(_dtype(cfg), cfg.get("barrier", "auto"))
    h, i = cfg["hidden"], cfg["inter"]
    need = 0
    for t in (cfg["tokens"], *cfg.get("retokens", ())):  # every token count the model runs at is a variant
        need += ag.heap_bytes(world, M=t, N=2 * i // world, K=h) + rs.heap_bytes(world, M=t, N=h, K=i)
    need += fd.heap_bytes(world, B=cfg["batch"], HKV=cfg["kv_heads"], G=cfg["group"], D=cfg["head_dim"],
                          S=cfg["seq"] // world)
    return need + (1 << 20)


def _dtype(cfg: dict) -> torch.dtype:
    return {"f16": torch.float16, "bf16": torch.bfloat16}[cfg["dtype"]]


def comm_group(device, world: int):
    """The process group plain TP runs its collectives over, and its backend: NCCL when every rank has a GPU of
    its own (a fair baseline), else gloo (the CPU emulation, or ranks sharing a GPU, which NCCL refuses). Not the
    default group: under spawn that is the heap's gloo group, which moves CUDA tensors through host memory (most of
    the 32 ms per layer plain TP took at world 1 in the first H200 logs, with its f32 SwiGLU)."""
    if device.type == "cuda" and world <= torch.cuda.device_count():
        return dist.new_group(backend="nccl"), "nccl"
    return dist.new_group(backend="gloo"), "gloo"


def _time(fn, iters: int, device, warmup: int = 3) -> float:
    """Seconds per call: `warmup` calls first (compiles, NCCL communicators, caches), then `iters` calls between
    two CUDA events on GPUs (no host sync inside the timed region but what the call does itself); wall clock on
    the CPU emulation, where it says little."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def _graphed(fn, device):
    """fn recorded as a CUDA graph (after an eager call, which sets up NCCL communicators and tilec variants):
    a function that replays it and returns the recorded output."""
    fn()
    torch.cuda.synchronize(device)
    dist.barrier()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()

    def replay():
        g.replay()
        return out

    return replay


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float().cpu() - want.float()).abs().max())


def _variants(cfg: dict, eager: dict, device, comm: str) -> tuple[dict, dict]:
    """Each eager variant, its CUDA-graph form on GPUs (name-graph), and why a form is missing."""
    out, skipped = dict(eager), {}
    if device.type != "cuda" or not cfg.get("graphs", True):
        return out, skipped
    for name, fn in eager.items():
        if name.endswith("compile") or name == "async-tp":
            continue  # compiled variants: inductor's own cudagraphs are mode="reduce-overhead"
        if name == "plain" and comm != "nccl":
            skipped["plain-graph"] = f"not captured: {comm} collectives go through the host"
            continue
        try:
            out[f"{name}-graph"] = _graphed(fn, device)
        except Exception as e:  # noqa: BLE001 - recorded in the results, the other variants still run
            skipped[f"{name}-graph"] = f"{type(e).__name__}: {str(e)[:300]}"
            torch.cuda.synchronize(device)
    return out, skipped


def run(heap, cfg: dict) -> dict:
    """One rank of the comparison: MLP layers and a decode step, tilec (eager, compiled, CUDA graph) against plain
    torch TP (eager, CUDA graph), async-TP (compiled, GPUs with world > 1) and the unsharded model. Returns max
    errors of every variant and, with cfg["iters"], times."""
    rank, world, device = heap.rank, heap.world, heap.device
    dtype, barrier = _dtype(cfg), cfg.get("barrier", "auto")
    group, comm = comm_group(device, world)
    gen = torch.Generator().manual_seed(cfg["seed"])
    t, h = cfg["tokens"], cfg["hidden"]
    layers = [MLPWeights(h, cfg["inter"], gen, dtype) for _ in range(cfg["layers"])]
    x = torch.randn(t, h, generator=gen)
    tp = nn.Sequential(*(TPMLP(w, rank, world, device, barrier) for w in layers))
    plain = nn.Sequential(*(TorchTPMLP(w, rank, world, device, group, comm) for w in layers))
    x_shard = x.to(dtype).chunk(world)[rank].to(device).contiguous()
    want = reference_mlp(x.to(dtype), layers).chunk(world)[rank]
    mlp = {"tilec": lambda: tp(x_shard), "plain": lambda: plain(x_shard)}
    notes = {"plain": f"matmul + {comm} collectives"}
    if cfg["compile"]:
        tp_c = torch.compile(tp, backend="inductor" if device.type == "cuda" else "eager", fullgraph=True)
        mlp["tilec-compile"] = lambda: tp_c(x_shard)
    if device.type == "cuda" and world > 1 and comm == "nccl" and cfg.get("async_tp", True):
        try:
            mlp["async-tp"] = _async_tp(layers, rank, world, device, group, x_shard)
        except Exception as e:  # noqa: BLE001 - recorded, the other variants still run
            notes["async-tp"] = f"not run: {type(e).__name__}: {str(e)[:300]}"
    out = {"world": world, "comm": comm, "scale": float(want.abs().max()), "mlp": {}, "decode": {}, "notes": notes}
    with torch.no_grad():
        mlp, skipped = _variants(cfg, mlp, device, comm)
        notes.update(skipped)
        for name, fn in mlp.items():
            out["mlp"][name] = {"err": _err(fn(), want)}
        for extra in cfg.get("retokens", ()):  # a new token count: each op compiles a variant for it, no user action
            xe = torch.randn(extra, h, generator=gen)
            model = tp_c if cfg["compile"] else tp
            got = model(xe.to(dtype).chunk(world)[rank].to(device).contiguous())
            out.setdefault("retokens", []).append(
                (extra, _err(got, reference_mlp(xe.to(dtype), layers).chunk(world)[rank])))

    b, hkv, g, d, seq = cfg["batch"], cfg["kv_heads"], cfg["group"], cfg["head_dim"], cfg["seq"]
    k_full = torch.randn(b, hkv, seq, d, generator=gen).to(dtype)
    v_full = torch.randn(b, hkv, seq, d, generator=gen).to(dtype)
    q = torch.randn(b, hkv * g, d, generator=gen).to(dtype)
    lens = torch.randint(1, seq + 1, (b,), generator=gen, dtype=torch.int32)
    s = seq // world
    attn = TPDecodeAttention(k_full[:, :, rank * s:(rank + 1) * s].to(device).contiguous(),
                             v_full[:, :, rank * s:(rank + 1) * s].to(device).contiguous(), barrier)
    want_o = reference_decode(q, k_full, v_full, lens)
    qd, ld = q.to(device), lens.to(device)
    decode = {"tilec": lambda: attn(qd, ld), "plain": lambda: torch_tp_decode(qd, attn.k, attn.v, ld, rank, world,
                                                                               group)}
    with torch.no_grad():
        decode, skipped = _variants(cfg, decode, device, comm)
        notes.update({f"decode {k}": v for k, v in skipped.items()})
        for name, fn in decode.items():
            out["decode"][name] = {"err": _err(fn(), want_o)}
        if cfg["iters"]:
            for table, fns, per in ((out["mlp"], mlp, cfg["layers"]), (out["decode"], decode, 1)):
                for name, fn in fns.items():
                    table[name]["s"] = _time(fn, cfg["iters"], device) / per
    # the fields the tests read: the tilec model as configured, plain TP
    out["mlp_err"] = out["mlp"]["tilec-compile" if cfg["compile"] else "tilec"]["err"]
    out["plain_err"] = out["mlp"]["plain"]["err"]
    out["decode_err"], out["decode_plain_err"] = out["decode"]["tilec"]["err"], out["decode"]["plain"]["err"]
    return out


def _async_tp(layers, rank: int, world: int, device, group, x_shard):
    """PyTorch async-TP: AsyncTPMLP compiled with inductor's micro-pipeline TP over symmetric memory."""
    import torch._inductor.config as inductor_config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    enable_symm_mem_for_group(group.group_name)
    model = nn.Sequential(*(AsyncTPMLP(w, rank, world, device, group) for w in layers))
    compiled = torch.compile(model, fullgraph=True)
    with inductor_config.patch(_micro_pipeline_tp=True), torch.no_grad():
        compiled(x_shard)  # compiles now, under the patched config
    return lambda: compiled(x_shard)


def report(res: dict, cfg: dict, world: int) -> str:
    lines = [f"TP MLP x{cfg['layers']} (T={cfg['tokens']} H={cfg['hidden']} I={cfg['inter']} {cfg['dtype']}, world "
             f"{world}, plain TP over {res['comm']}; max |out| {res['scale']:.3g})",
             f"{'variant':>16} {'max |err|':>10} {'us/layer':>10} {'tokens/s':>12} (prefill, {cfg['layers']} layers)"]
    for name, r in res["mlp"].items():
        times = (f"{r['s'] * 1e6:10.1f} {cfg['tokens'] / (r['s'] * cfg['layers']):12.0f}" if "s" in r else "")
        lines.append(f"{name:>16} {r['err']:10.3g} {times}")
    lines += [f"TP decode step (B={cfg['batch']} HKV={cfg['kv_heads']} G={cfg['group']} D={cfg['head_dim']} "
              f"seq={cfg['seq']})", f"{'variant':>16} {'max |err|':>10} {'us/step':>10} {'tokens/s':>12}"]
    for name, r in res["decode"].items():
        times = (f"{r['s'] * 1e6:10.1f} {cfg['batch'] / r['s']:12.0f}" if "s" in r else "")
        lines.append(f"{name:>16} {r['err']:10.3g} {times}")
    lines += [f"  {k}: {v}" for k, v in res["notes"].items()]
    for extra, err in res.get("retokens", ()):
        lines.append(f"  tilec model at T={extra} (a new variant): max |err| {err:.3g}")
    # the old summary lines, which tests and logs grep for
    lines.append(f"max |err| vs unsharded: tilec {res['mlp_err']:.3g}, plain TP {res['plain_err']:.3g} (MLP)")
    lines.append(f"max |err| vs unsharded: tilec {res['decode_err']:.3g}, plain TP {res['decode_plain_err']:.3g} "
                 "(decode)")
    return "\n".join(lines)


def results_json(res: dict, cfg: dict, world: int) -> dict:
    """What --out saves: the configuration, and per variant its error, seconds and tokens/s (rank 0's clock)."""
    rows = {}
    for part, per, toks, n in (("mlp", "layer", cfg["tokens"], cfg["layers"]), ("decode", "step", cfg["batch"], 1)):
        rows[part] = {name: {"max_err": r["err"], **({f"s_per_{per}": r["s"], "tokens_per_s": toks / (r["s"] * n)}
                                                      if "s" in r else {})} for name, r in res[part].items()}
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"config": cfg, "world": world, "device": device, "plain_tp_comm": res["comm"], "max_abs_out": res["scale"],
            **rows, "retokens": res.get("retokens", []), "notes": res["notes"]}


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2, help="ranks to spawn when not under torchrun (default 2)")
    ap.add_argument("--backend", default="auto", choices=("auto", "cpu", "iris"),
                    help="cpu: the CPU emulation; iris: GPUs (default: iris where a GPU is)")
    ap.add_argument("--hidden", type=int, default=64, help="model width H (Llama-3-8B: 4096, 70B: 8192)")
    ap.add_argument("--inter", type=int, default=128, help="MLP width I (8B: 14336, 70B: 28672)")
    ap.add_argument("--tokens", type=int, default=64, help="prefill tokens T (a multiple of the world size)")
    ap.add_argument("--retokens", type=int, nargs="*", default=[], help="more token counts to run the tilec model "
                    "at afterwards (a shape change: each compiles new op variants)")
    ap.add_argument("--layers", type=int, default=2, help="MLP layers (default 2)")
    ap.add_argument("--batch", type=int, default=2, help="decode batch (sequences)")
    ap.add_argument("--kv-heads", type=int, default=2, help="KV heads")
    ap.add_argument("--group", type=int, default=2, help="query heads per KV head (GQA)")
    ap.add_argument("--head-dim", type=int, default=64, help="head dim")
    ap.add_argument("--seq", type=int, default=128, help="KV cache positions over all ranks (a multiple of the "
                    "world size)")
    ap.add_argument("--dtype", default="f16", choices=("f16", "bf16"), help="activations and weights (default f16)")
    ap.add_argument("--compile", action="store_true", help="also the tilec model under torch.compile(fullgraph=True) "
                    "(eager backend on the CPU, inductor on GPUs)")
    ap.add_argument("--barrier", default="auto", choices=("auto", "device"),
                    help="tilec ops' barriers: auto (host barriers, device kernels inside CUDA graphs) or device "
                    "(device kernels always)")
    ap.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph forms of the variants (GPUs)")
    ap.add_argument("--no-async-tp", action="store_true", help="skip PyTorch async-TP (GPUs, world > 1)")
    ap.add_argument("--iters", type=int, default=0, help="timed calls per variant, after 3 warmup calls (0: none; "
                    "times only mean anything on GPUs)")
    ap.add_argument("--seed", type=int, default=0, help="weights and inputs")
    ap.add_argument("--out", default=None, help="write the results (every variant's error, time, tokens/s) as JSON "
                    "to this path (rank 0)")
    return ap.parse_args(argv)


def _config(a: argparse.Namespace) -> dict:
    return {"hidden": a.hidden, "inter": a.inter, "tokens": a.tokens, "retokens": list(a.retokens),
            "layers": a.layers, "batch": a.batch, "kv_heads": a.kv_heads, "group": a.group, "head_dim": a.head_dim,
            "seq": a.seq, "dtype": a.dtype, "compile": a.compile, "barrier": a.barrier, "graphs": not a.no_graphs,
            "async_tp": not a.no_async_tp, "iters": a.iters, "seed": a.seed}


def _emit(res: dict, cfg: dict, world: int, out: str | None) -> None:
    print(report(res, cfg, world), flush=True)
    if out:
        import json

        Path(out).write_text(json.dumps(results_json(res, cfg, world), indent=2) + "\n")
        print(f"results: {out}")


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
                    _emit(res, cfg, world, a.out)
            finally:
                heap.close()
        finally:
            dist.barrier()  # no rank tears the group down while a peer's last collective is still in flight
            dist.destroy_process_group()
        return 0
    backend = a.backend if a.backend != "auto" else tilec.runtime.default_backend()
    results = tilec.runtime.spawn(run, a.world, backend=backend, heap_bytes=heap_bytes(cfg, a.world),
                                  args=(cfg,))
    _emit(results[0], cfg, a.world, a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
