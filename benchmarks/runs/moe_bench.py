"""examples/moe.tile against torch, at world 1 and expert-parallel at worlds 2 and 4 (ranks side by side on one GPU
under MPS). Two torch forms, both timed: the routed token rows gathered with `index_select` (at world W from every
rank's tokens through torch symmetric memory's peer views: NCCL refuses ranks that share a GPU under MPS), only
those rows (each expert's group padded to 16) through the SwiGLU expert GEMMs as `torch._grouped_mm` where this
torch has it (else a loop of matmuls), the expert rows taken back from their owners the same way, and the weighted
combine; and the same over every capacity slot (tilec's layout: uniform groups, the unused slots computed too).
Symmetric memory's device barrier between the exchanges. tilec: bsp, flags and specialized, and at worlds above 1
bsp again with its barriers as device kernels (`device_epoch=True, device_barrier=True`). Device time of eager
calls after an L2 flush (tilec.perf.gpu_time), median of 20, the slowest rank's; every output checked against
tilec.moe.reference on each rank's first 8 tokens.

    python benchmarks/runs/moe_bench.py OUT.json [--tokens 4096 --hidden 2048 --ffn 1024 --experts 8 --topk 2]
    sh benchmarks/runs/mps_world.sh --spawn 2 python3 benchmarks/runs/moe_bench.py OUT.json --world 2 [...]
    python benchmarks/runs/moe_bench.py /tmp/moe_cpu.json --backend cpu --tokens 32 --hidden 64 --ffn 64 --experts 2 \
        [--world 2]
    python benchmarks/runs/moe_bench.py OUT.json --replot      # OUT.png again from OUT.json
    ... --timeline    # also each tilec schedule's stages: wall, work and flag-wait time (a timeline build, rank 0)

--experts is the number of experts per rank, --tokens per rank. OUT.png beside OUT.json: the rows as bars, each
labelled with its time over the faster torch row. The CPU form (the Triton interpreter; the heap's shared buffers and
barriers stand in for symmetric memory) only checks the script: its times say nothing. --tile sets the program's
tiles (Hopper: --tile BC=128 --tile BF=128 --tile BH=128 --tile BK=64 --num-warps 8); the routing blocks follow BC.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

import tilec
from tilec import moe
from tilec.runtime import spawn


def _grouped_swiglu(xe, w1, w3, w2, sizes):
    """The experts' SwiGLU GEMMs over xe's expert-major groups of sizes[e] rows."""
    el, h, f = len(sizes), xe.shape[1], w1.shape[1]
    grouped = getattr(torch, "_grouped_mm", None)
    if grouped is not None and xe.is_cuda:
        offs = torch.tensor(sizes, dtype=torch.int32).cumsum(0).to(device=xe.device, dtype=torch.int32)
        a = grouped(xe, w1.view(el, h, f), offs=offs)
        b = grouped(xe, w3.view(el, h, f), offs=offs)
        return grouped((torch.nn.functional.silu(a.float()) * b.float()).to(xe.dtype), w2.view(el, f, h), offs=offs)
    ys, at = [], 0
    for e, n in enumerate(sizes):
        xb = xe[at:at + n]
        a, b = xb @ w1[e * h:(e + 1) * h], xb @ w3[e * h:(e + 1) * h]
        ys.append((torch.nn.functional.silu(a.float()) * b.float()).to(xe.dtype) @ w2[e * f:(e + 1) * f])
        at += n
    return torch.cat(ys)


def _combine(yb, wt, k):
    """The weighted sum of each token's K expert rows: yb [K*T, H] holds choice j of token t at j*T + t."""
    t_n = wt.shape[0]
    out = torch.zeros(t_n, yb.shape[1], dtype=torch.float32, device=yb.device)
    for j in range(k):
        out += wt[:, j:j + 1] * yb[j * t_n:(j + 1) * t_n].float()
    return out


GROUP_ROWS = 16  # each expert's group of rows padded to a multiple of this (what grouped GEMM kernels tile by)


def _packing(routes, el, cap):
    """Per owner o: (per sender r, the token rows of r it takes, (el, c)-ordered), the order of those rows in o's
    expert-major groups (an index into their concatenation, each group padded with row 0 to a multiple of
    GROUP_ROWS), the group sizes, and per (sender r, slot) the row of o's packed output holding that slot."""
    world = len(routes)
    out = []
    for o in range(world):
        cnt, src = routes[o]["cnt"].tolist(), routes[o]["src"].tolist()
        take = [[src[(r * el + e) * cap + c] for e in range(el) for c in range(cnt[r * el + e])]
                for r in range(world)]
        first = [sum(len(t) for t in take[:r]) for r in range(world)]  # where sender r's rows start in the cat
        order, sizes, where = [], [], {}
        for e in range(el):
            start = len(order)
            for r in range(world):
                before = sum(cnt[r * el + x] for x in range(e))
                for c in range(cnt[r * el + e]):
                    where[(r, (o * el + e) * cap + c)] = len(order)
                    order.append(first[r] + before + c)
            order += [0] * (-(len(order) - start) % GROUP_ROWS)
            sizes.append(len(order) - start)
        out.append((take, order, sizes, where))
    return out


def _torch_layer(me, world, x_peers, ye_peers, barrier, w1, w3, w2, routes, el, cap, k):
    """The torch baseline of one rank: x_peers[r] is rank r's tokens [T, H], ye_peers[o] rank o's expert outputs
    (rows of its packed groups; symmetric memory's peer views, on one rank the tensors themselves). Only routed rows
    are gathered and multiplied (each expert's group padded to GROUP_ROWS); the gather indices are built once, from
    the routing tables, outside the timed call, as tilec's are."""
    t_n, h = x_peers[me].shape
    dev = x_peers[me].device
    packs = _packing(routes, el, cap)
    take, order, sizes, _ = packs[me]
    take = [torch.tensor(t, dtype=torch.long, device=dev) for t in take]
    order = torch.tensor(order, dtype=torch.long, device=dev)
    rows = [len(p[1]) for p in packs]  # each owner's packed rows
    base = [sum(rows[:o]) for o in range(world)]
    slot, wt = routes[me]["slot"].tolist(), routes[me]["wt"].to(dev)
    owner = [s // (el * cap) for s in slot]
    back = torch.tensor([base[o] + packs[o][3].get((me, s), 0) for s, o in zip(slot, owner, strict=True)],
                        dtype=torch.long, device=dev)  # a dropped choice (weight 0) names any row

    def run():
        barrier()  # every rank's tokens are in place
        xd = torch.cat([x_peers[r].index_select(0, take[r]) for r in range(world)])
        y = _grouped_swiglu(xd.index_select(0, order), w1, w3, w2, sizes)
        ye_peers[me].view(-1, h)[:len(order)].copy_(y)
        barrier()  # every owner's expert rows are in place
        yall = torch.cat([ye_peers[o].view(-1, h)[:rows[o]] for o in range(world)])
        out = _combine(yall.index_select(0, back), wt, k)
        barrier()  # no peer still reads this rank's buffers: the next call may overwrite them
        return out.to(x_peers[me].dtype)

    return run


def _torch_layer_slots(me, world, x_peers, ye_peers, barrier, w1, w3, w2, routes, el, cap, k):
    """The torch baseline in tilec's layout: every capacity slot of every (sender, expert) block gathered and
    multiplied (used or not, expert groups of world * cap rows, the uniform groups grouped GEMM kernels like best),
    the expert rows left in the owner's slots for the senders to take back by their slot numbers. Beside
    _torch_layer (only the routed rows) because neither form is the faster everywhere."""
    t_n, h = x_peers[me].shape
    dev = x_peers[me].device
    src = routes[me]["src"].to(device=dev, dtype=torch.long).view(world, el * cap)  # per sender, its rows per slot
    slot, wt = routes[me]["slot"].to(device=dev, dtype=torch.long), routes[me]["wt"].to(dev)
    sizes = [world * cap] * el

    def run():
        barrier()  # every rank's tokens are in place
        xd = torch.stack([x_peers[r].index_select(0, src[r]) for r in range(world)])  # [W, EL*C, H]
        xe = xd.view(world, el, cap, h).transpose(0, 1).reshape(el * world * cap, h)  # expert-major groups
        y = _grouped_swiglu(xe, w1, w3, w2, sizes).view(el, world, cap, h).transpose(0, 1)
        ye_peers[me].view(-1)[:world * el * cap * h].view(world, el, cap, h).copy_(y)
        barrier()  # every owner's expert rows are in place
        yall = torch.cat([ye_peers[o].view(-1)[:world * el * cap * h].view(world, el * cap, h)[me]
                          for o in range(world)])  # [W*EL*C, H]: slot (o*EL + el)*C + c
        out = _combine(yall.index_select(0, slot), wt, k)
        barrier()  # no peer still reads this rank's buffers: the next call may overwrite them
        return out.to(x_peers[me].dtype)

    return run


def _exchange_buffers(heap, shapes, log):
    """Per shape: (this rank's f16 buffer, every rank's by rank), and a barrier over the ranks: torch symmetric memory
    on a GPU (tilec.perf.bench_baselines._symm_exchange: its device barrier), the heap's shared buffers and host
    barrier on the CPU; None where neither is."""
    if heap.world == 1:
        bufs = [torch.zeros(sh, dtype=torch.float16, device=heap.device) for sh in shapes]
        return [(b, [b]) for b in bufs], (lambda: None)
    if heap.device.type != "cuda":
        bufs = [heap.alloc(sh, torch.float16) for sh in shapes]
        return [(b, [heap.peer_view(b, r) for r in range(heap.world)]) for b in bufs], heap.barrier
    from tilec.perf.bench_baselines import _symm_exchange

    numel = [math.prod(sh) for sh in shapes]
    got = _symm_exchange(heap, sum(numel), log, dtype=torch.float16)
    if got is None:
        return None
    _mine, whole, barrier = got
    out, at = [], 0
    for sh, n in zip(shapes, numel, strict=True):
        peers = [b[at:at + n].view(sh) for b in whole]
        out.append((peers[heap.rank], peers))
        at += n
    return out, barrier


def rank(heap, args):
    dev = "cpu" if heap.interpret else "cuda"
    me, world = heap.rank, heap.world
    t_n, h, f, el, k = args.tokens, args.hidden, args.ffn, args.experts, args.topk
    # slots per (sending rank, expert): 1.25x an even share of a rank's t_n * k choices over the world's experts
    cap = max(16, -(-int(1.25 * t_n * k / (el * world)) // 16) * 16)
    g = torch.Generator().manual_seed(0)  # every rank draws every rank's data, then keeps its own
    xs = [torch.randn(t_n, h, generator=g).half() for _ in range(world)]
    def weights(rows, cols):
        return (torch.randn(rows, cols, generator=g) / rows ** 0.5 * el ** 0.5).half()  # / sqrt(fan-in)

    ws = [(weights(el * h, f), weights(el * h, f), weights(el * f, h)) for _ in range(world)]
    ids = [torch.stack([torch.randperm(world * el, generator=g)[:k] for _ in range(t_n)]) for _ in range(world)]
    wts = [torch.rand(t_n, k, generator=g) for _ in range(world)]
    routes = moe.route(ids, wts, el, cap, block=args.tiles.get("BC", 16))
    rt = routes[me]
    want = moe.reference([x[:8] for x in xs], [w[0] for w in ws], [w[1] for w in ws], [w[2] for w in ws],
                         [i[:8] for i in ids], [w[:8] for w in wts], el, cap)[me]
    x, (w1, w3, w2) = xs[me], ws[me]

    def err8(out):  # the largest error of an output's first 8 tokens against the reference
        return float((out[:8].float().cpu() - want[:8]).abs().max())

    ins = {"X": x, "W1": w1, "W3": w3, "W2": w2, **rt}
    dims = {"T": t_n, "H": h, "F": f, "EL": el, "C": cap, "K": k, **args.tiles}
    rows = []
    for sched in ("bsp", "flags", "specialized"):
        prog = tilec.compile("examples/moe.tile", world=world, schedule=sched, dims=dims, num_warps=args.num_warps or 4)
        mark = heap.mark()
        bufs = {n: heap.alloc(shape, torch.float32 if dt == "f32" else torch.int32 if dt == "i32" else torch.float16)
                for n, (_kind, dt, shape, _s) in prog.signature().items()}
        for n, v in ins.items():
            bufs[n].copy_(v)
        out = prog(heap, **bufs)["O"]
        row = {"impl": f"tilec {sched}", "seconds": _time(lambda p=prog, b=bufs: p(heap, **b), dev),
               "max_err_first_8_tokens": err8(out)}
        rows.append(row)
        if world > 1 and sched == "bsp":  # its barriers as device kernels (host barriers cost most under MPS)
            fast = tilec.compile("examples/moe.tile", world=world, schedule=sched, dims=dims,
                                 num_warps=args.num_warps or 4)  # a program of its own: the epoch lives on the device
            out = fast(heap, device_epoch=True, device_barrier=True, **bufs)["O"]
            rows.append({"impl": "tilec bsp, device barriers",
                         "seconds": _time(lambda p=fast, b=bufs: p(heap, device_epoch=True, device_barrier=True,
                                                                     **b), dev),
                         "max_err_first_8_tokens": err8(out)})
        if args.timeline:  # where a call's time goes, per stage, from a timeline build of the same schedule
            tl = tilec.compile("examples/moe.tile", world=world, schedule=sched, dims=dims,
                               num_warps=args.num_warps or 4, timeline=True)
            for _ in range(2):  # the second call's records: compiled and warm
                tl(heap, **bufs)
            row["timeline"] = _stage_times(tl, heap)
        heap.barrier()
        heap.release(mark)
    got = _exchange_buffers(heap, [(t_n, h), (world * el * cap + el * GROUP_ROWS, h)], print)
    if got is not None:
        (xb, x_peers), (_yb, ye_peers) = got[0]
        barrier = got[1]
        xb.copy_(x.to(dev))
        form = "_grouped_mm" if hasattr(torch, "_grouped_mm") and dev == "cuda" else "matmul loop"
        for make, what in ((_torch_layer, "routed rows"), (_torch_layer_slots, "capacity slots")):
            layer = make(me, world, x_peers, ye_peers, barrier, w1.to(dev), w3.to(dev), w2.to(dev), routes, el, cap,
                         k)
            err = err8(layer())  # the first call, before the timed ones
            rows.append({"impl": f"torch {form}, {what}" + (" + symm_mem peers" if world > 1 else ""),
                         "seconds": _time(layer, dev), "max_err_first_8_tokens": err})
    heap.barrier()
    return {"shape": {"tokens": t_n, "hidden": h, "ffn": f, "experts": el, "topk": k, "capacity": cap,
                      "world": world},
            "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu (Triton interpreter: times say nothing)",
            "rows": rows}


def _stage_times(prog, heap) -> dict:
    """This rank's last call of a timeline build: its span, the time between kernels (launches, host barriers), and
    per stage its tasks, wall time (first task's start to last task's end), summed work and flag waits, in us."""
    from tilec.perf.timeline import timeline

    tl = timeline(prog, heap)
    stages = {}
    for k in tl.kernels:
        for name, n, work, wait, first, last in k.per_stage:
            stages[name] = {"tasks": n, "wall_us": (last - first) / 1e3, "work_us": work / 1e3, "wait_us": wait / 1e3,
                            "programs": k.programs}
    return {"span_us": tl.total_ns / 1e3, "between_kernels_us": tl.between_ns / 1e3, "stages": stages}


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
    base = min(r["seconds"] for r in rows if r["impl"].startswith("torch"))  # the faster torch form
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    us = [r["seconds"] * 1e6 for r in rows]
    ax.barh([r["impl"] for r in rows], us, color=["#4c72b0" if r["impl"].startswith("tilec") else "#999999"
                                                  for r in rows])
    for i, (r, t) in enumerate(zip(rows, us, strict=True)):
        ax.text(t, i, f" {t:.0f} us ({r['seconds'] / base:.2f}x torch)", va="center", fontsize=8)
    sh = res["shape"]
    ax.set_xlabel("device time per layer call, us (median of 20, L2 flushed, the slowest rank)")
    ax.set_title(f"MoE layer, world {sh.get('world', 1)}, {res['device']}: T={sh['tokens']} H={sh['hidden']} "
                 f"F={sh['ffn']} E={sh['experts']}/rank top-{sh['topk']}", fontsize=9)
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
    p.add_argument("--world", type=int, default=1, help="ranks (several on one GPU: run under mps_world.sh --spawn)")
    p.add_argument("--tile", action="append", default=[], help="a tile size, e.g. --tile BC=64")
    p.add_argument("--num-warps", type=int, default=None)
    p.add_argument("--replot", action="store_true", help="only write OUT.png from OUT.json")
    p.add_argument("--timeline", action="store_true",
                   help="also time each tilec schedule's stages (a timeline build of it, rank 0's call)")
    args = p.parse_args(argv)
    png = args.out.rsplit(".", 1)[0] + ".png"
    if args.replot:
        with open(args.out) as fh:
            plot(json.load(fh), png)
        return 0
    args.tiles = {kv.split("=")[0]: int(kv.split("=")[1]) for kv in args.tile}
    per_rank = spawn(rank, args.world, backend=args.backend, args=(args,),
                     heap_bytes=2 << 30 if args.backend == "iris" else 1 << 26, timeout=3600)
    res = per_rank[0]
    for i, row in enumerate(res["rows"]):  # the slowest rank's time, the largest error
        row["seconds"] = max(r["rows"][i]["seconds"] for r in per_rank)
        row["max_err_first_8_tokens"] = max(r["rows"][i]["max_err_first_8_tokens"] for r in per_rank)
    if args.world > 1 and args.backend == "iris":
        res["note"] = ("ranks side by side on one GPU under MPS when run by mps_world.sh: peers' memory is HBM of the "
                       "same GPU, not NVLink")
    with open(args.out, "w") as fh:
        json.dump(res, fh, indent=1)
    try:
        plot(res, png)
    except ImportError:  # no matplotlib: the JSON is the result
        pass
    print(f"moe at world {args.world} on {res['device']}: {res['shape']}")
    for r in res["rows"]:
        err = r["max_err_first_8_tokens"]
        print(f"  {r['impl']:44} {r['seconds'] * 1e6:12.1f} us   max error (first 8 tokens) {err:.3g}")
        tl = r.get("timeline")
        if tl:
            print(f"    rank 0's timeline build: span {tl['span_us']:.0f} us, between kernels "
                  f"{tl['between_kernels_us']:.0f} us")
            for name, st in tl["stages"].items():
                print(f"      {name:10} {st['tasks']:6} tasks on {st['programs']:4} programs: "
                      f"wall {st['wall_us']:8.1f} us, work {st['work_us']:10.1f} us, "
                      f"flag waits {st['wait_us']:10.1f} us (summed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
