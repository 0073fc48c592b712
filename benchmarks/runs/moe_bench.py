"""examples/moe.tile at world 1 against torch: the same layer (gather the routed tokens per expert, SwiGLU expert
GEMMs, weighted combine) as `torch._grouped_mm` over the experts' slot blocks where this torch has it, else a loop
of matmuls, with index_select / index_add_ for the dispatch and combine. Device time of eager calls after an L2
flush (tilec.perf.gpu_time), median of 20; every output checked against tilec.moe.reference on a few tokens.

    python benchmarks/runs/moe_bench.py OUT.json [--tokens 4096 --hidden 2048 --ffn 1024 --experts 8 --topk 2]
    python benchmarks/runs/moe_bench.py /tmp/moe_cpu.json --backend cpu --tokens 32 --hidden 64 --ffn 64 --experts 2
    python benchmarks/runs/moe_bench.py OUT.json --replot      # OUT.png again from OUT.json

OUT.png beside OUT.json: the rows as bars, each labelled with its time over the torch row.

The CPU form (the Triton interpreter) only checks the script; its times say nothing. The expert-parallel form at
worlds 2/4 (MPS, symmetric-memory all_to_all baseline) is not written. --tile sets the program's tiles (Hopper:
--tile BC=128 --tile BF=128 --tile BH=128 --tile BK=64 --num-warps 8); the routing blocks follow BC.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import tilec
from tilec import moe
from tilec.runtime import spawn


def _layer(x, w1, w3, w2, rt, el, cap, k):
    """The torch baseline: per expert, its slots' rows gathered, SwiGLU, scattered back with the weights."""
    t_n, h = x.shape
    src, cnt, slot, wt = rt["src"].long(), rt["cnt"], rt["slot"].long(), rt["wt"]
    xd = x.index_select(0, src)  # [EL*C, H]: every slot (unused ones name row 0)
    f = w1.shape[1]
    grouped = getattr(torch, "_grouped_mm", None)
    if grouped is not None and x.is_cuda:
        offs = torch.arange(1, el + 1, device=x.device, dtype=torch.int32) * cap
        a = grouped(xd, w1.view(el, h, f), offs=offs)
        b = grouped(xd, w3.view(el, h, f), offs=offs)
        y = grouped((torch.nn.functional.silu(a.float()) * b.float()).to(x.dtype), w2.view(el, f, h), offs=offs)
    else:
        ys = []
        for e in range(el):
            n = int(cnt[e])
            xe = xd[e * cap:e * cap + n]
            a, b = xe @ w1[e * h:(e + 1) * h], xe @ w3[e * h:(e + 1) * h]
            ye = (torch.nn.functional.silu(a.float()) * b.float()).to(x.dtype) @ w2[e * f:(e + 1) * f]
            ys.append(torch.cat([ye, ye.new_zeros(cap - n, h)]))
        y = torch.cat(ys)
    out = torch.zeros(t_n, h, dtype=torch.float32, device=x.device)
    for j in range(k):
        out += wt[:, j:j + 1] * y.index_select(0, slot[j * t_n:(j + 1) * t_n]).float()
    return out.to(x.dtype)


def rank(heap, args):
    dev = "cpu" if heap.interpret else "cuda"
    t_n, h, f, el, k = args.tokens, args.hidden, args.ffn, args.experts, args.topk
    cap = max(16, -(-int(1.25 * t_n * k / el) // 16) * 16)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(t_n, h, generator=g).half()
    w1, w3 = ((torch.randn(el * h, f, generator=g) / h ** 0.5).half() for _ in range(2))
    w2 = (torch.randn(el * f, h, generator=g) / f ** 0.5).half()
    ids = torch.stack([torch.randperm(el, generator=g)[:k] for _ in range(t_n)])
    wts = torch.rand(t_n, k, generator=g)
    rt = moe.route([ids], [wts], el, cap, block=args.tiles.get("BC", 16))[0]
    want = moe.reference([x[:8]], [w1], [w3], [w2], [ids[:8]], [wts[:8]], el, cap)[0]
    ins = {"X": x, "W1": w1, "W3": w3, "W2": w2, **rt}
    dims = {"T": t_n, "H": h, "F": f, "EL": el, "C": cap, "K": k, **args.tiles}
    rows = []
    for sched in ("bsp", "flags", "specialized"):
        prog = tilec.compile("examples/moe.tile", world=1, schedule=sched, dims=dims, num_warps=args.num_warps or 4)
        mark = heap.mark()
        bufs = {n: heap.alloc(shape, torch.float32 if dt == "f32" else torch.int32 if dt == "i32" else torch.float16)
                for n, (_kind, dt, shape, _s) in prog.signature().items()}
        for n, v in ins.items():
            bufs[n].copy_(v)
        out = prog(heap, **bufs)["O"]
        err = float((out[:8].float().cpu() - want[:8]).abs().max())
        rows.append({"impl": f"tilec {sched}", "seconds": _time(lambda p=prog, b=bufs: p(heap, **b), dev),
                     "max_err_first_8_tokens": err})
        heap.release(mark)
    tins = {n: v.to(dev) for n, v in ins.items()}
    base = _layer(tins["X"], tins["W1"], tins["W3"], tins["W2"], tins, el, cap, k)
    rows.append({"impl": "torch " + ("_grouped_mm" if hasattr(torch, "_grouped_mm") and dev == "cuda"
                                     else "matmul loop"),
                 "seconds": _time(lambda: _layer(tins["X"], tins["W1"], tins["W3"], tins["W2"], tins, el, cap, k),
                                  dev),
                 "max_err_first_8_tokens": float((base[:8].float().cpu() - want[:8]).abs().max())})
    return {"shape": {"tokens": t_n, "hidden": h, "ffn": f, "experts": el, "topk": k, "capacity": cap},
            "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (Triton interpreter: times say nothing)",
            "rows": rows}


def _time(fn, dev: str) -> float:
    if dev == "cuda":
        from tilec.perf.gpu_time import cold_time

        return cold_time(fn, reps=20)
    ts = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = res["rows"]
    base = next(r["seconds"] for r in rows if r["impl"].startswith("torch"))
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    us = [r["seconds"] * 1e6 for r in rows]
    ax.barh([r["impl"] for r in rows], us, color=["#4c72b0" if r["impl"].startswith("tilec") else "#999999"
                                                  for r in rows])
    for i, (r, t) in enumerate(zip(rows, us, strict=True)):
        ax.text(t, i, f" {t:.0f} us ({r['seconds'] / base:.2f}x torch)", va="center", fontsize=8)
    sh = res["shape"]
    ax.set_xlabel("device time per layer call, us (median of 20, L2 flushed)")
    ax.set_title(f"MoE layer, world 1, {res['device']}: T={sh['tokens']} H={sh['hidden']} F={sh['ffn']} "
                 f"E={sh['experts']} top-{sh['topk']}", fontsize=9)
    ax.set_xlim(0, max(us) * 1.6)
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--backend", default="iris", choices=("iris", "cpu"))
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--topk", type=int, default=2)
    p.add_argument("--tile", action="append", default=[], help="a tile size, e.g. --tile BC=64")
    p.add_argument("--num-warps", type=int, default=None)
    p.add_argument("--replot", action="store_true", help="only write OUT.png from OUT.json")
    args = p.parse_args(argv)
    png = args.out.rsplit(".", 1)[0] + ".png"
    if args.replot:
        with open(args.out) as fh:
            plot(json.load(fh), png)
        return 0
    args.tiles = {kv.split("=")[0]: int(kv.split("=")[1]) for kv in args.tile}
    res = spawn(rank, 1, backend=args.backend, args=(args,), heap_bytes=2 << 30 if args.backend == "iris" else 1 << 26,
                timeout=3600)[0]
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)
    try:
        plot(res, png)
    except ImportError:  # no matplotlib: the JSON is the result
        pass
    print(f"moe at world 1 on {res['device']}: {res['shape']}")
    for r in res["rows"]:
        err = r["max_err_first_8_tokens"]
        print(f"  {r['impl']:22} {r['seconds'] * 1e6:12.1f} us   max error (first 8 tokens) {err:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
