"""One GPU split by MPS: tilec's bsp and fused schedules of a GEMM program beside the concurrent plain torch.matmul of
the same per-rank work, all timed in one run (every rank at once, a cross-rank barrier and an L2 flush that reads
before each timed run, outside the CUDA events; CUDA graph replays where the op can be captured).

  sh benchmarks/runs/mps_world.sh --spawn W python3 benchmarks/runs/mps_fused.py PROGRAM W OUT.json [--timeline]

PROGRAM: examples/ag_gemm.tile or examples/gemm_rs.tile at the paper shape 8192x4608x36864 (-D M=.. N=.. K=..
after OUT.json to change it), tilec bench's first Hopper config (BM=128 BN=256 BK=64, 8 warps, 3 stages, group_m 8).
Rows (two rounds, the second in reverse order; each row keeps its faster median):
- bsp as tilec bench times it (a host barrier between its kernels: CUDA events around an eager call), and bsp with
  device barriers (device_epoch + device_barrier, one CUDA graph): the stronger bsp;
- fused-pull (ag), fused-push, and what `--schedule auto` picks (the cost model, MPS machine) when it is another;
- ag only: fused-push with its copies in destination order (0, 1, ..: before they went in the order the peers read
  them), and with that and the program-major remap forced under claims (the order before it was task-major): A/Bs
  of the task order in the same run; rs: fused-push with every rank pushing to rank 0 first (owners in rank order);
- matmul: torch.matmul of the rank's whole GEMM (ag: [M, K] @ [K, N]; rs: its K-shard [M, K/W] @ [K/W, N]) run by
  every rank at once: the compute-only bound the targets name;
- the cost model's prediction of every schedule (tilec.perf.auto.rank_schedules on the MPS machine).
--timeline: per-task clocks of bsp and fused-push (and the program-major fused-push) timeline builds.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
import time

import torch

ITERS = 12
COPY_ORDER = r"gather_task\(\(rank \+ \d+ - copied // \d+\) % \d+ \* \d+ \+ copied % \d+, "


def _compile(path, world, name, dims, launch):
    from tilec.perf.auto import compile_variant

    return compile_variant(path, world, name, dims, **launch)


def cases(path: str, world: int, dims: dict, launch: dict, pattern: str) -> list[tuple[str, object, str]]:
    """(row name, program, how it is timed: bench | devbar)."""
    names = ["bsp", "fused-pull", "fused-push"] if pattern == "ag" else ["bsp", "fused-push"]
    out = [(s, _compile(path, world, s, dims, launch), "bench") for s in names]
    bsp = out[0][1]
    out.insert(1, ("bsp (device barriers, graph)", dataclasses.replace(bsp, _state={}), "devbar"))
    fp = next(p for s, p, _ in out if s == "fused-push")
    by_dest, n_dest = re.subn(COPY_ORDER, "gather_task(copied, ", fp.source)
    if n_dest:  # the copies to the peers in the order they read them: A/B against destination order
        out.append(("fused-push (copies by destination)", dataclasses.replace(fp, source=by_dest, _state={}), "bench"))
    if "if not CLAIM:" in fp.source:  # the interleaved order: A/B the task-major mix against program-major (and
        # the copies by destination: the order before both changes)
        old = by_dest.replace("if not CLAIM:", "if True:  # A/B: program-major under claims too")
        out.append(("fused-push (program-major)", dataclasses.replace(fp, source=old, _state={}), "bench"))
    old, n = re.subn(r"gemm_task\(\(task \+ \(rank \+ 1\) \* \d+\) % \d+, ", "gemm_task(task, ", fp.source)
    if n:  # pushes round the owners, its own last: A/B against every rank pushing to rank 0 first
        out.append(("fused-push (owners in rank order)", dataclasses.replace(fp, source=old, _state={}), "bench"))
    return out


def _devbar_timing(prog, heap, iters: int, inputs: dict):
    """bsp with its barriers as device kernels, the whole call one CUDA graph (tilec ops run it this way)."""
    from tilec.perf.inputs import bench_inputs
    from tilec.perf.measure import time_op

    inner = heap.mark()
    try:
        args = bench_inputs(prog, heap, 0)
        for nm, x in inputs.items():
            args[nm].copy_(x)

        def call():
            prog(heap, entry_barrier=False, sync=False, device_epoch=True, device_barrier=True, **args)

        prog(heap, device_epoch=True, device_barrier=True, **args)  # compiles; its first entry barrier is a host one
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            heap.barrier()
            call()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        heap.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        torch.cuda.synchronize()
        t = time_op(call, heap, iters, 2, replay=graph.replay, capture=False, host_iters=1)
        torch.cuda.synchronize()
        heap.barrier()
        graph.replay()
        torch.cuda.synchronize()
        return t, args["C"].clone()
    finally:
        heap.release(inner)


def rank(heap, pattern: str, dims: dict, progs: list, timelines: list, iters: int) -> dict:
    from tilec.perf.bench import _tilec_timing
    from tilec.perf.inputs import gemm_inputs, gemm_reference
    from tilec.perf.measure import time_op
    from tilec.perf.rows import rel_err
    from tilec.perf.timeline import rank_timelines

    world = heap.world
    a, b = gemm_inputs(pattern, dims, world, heap.rank, "f16", heap.device)
    ref = gemm_reference(pattern, dims, world, heap.rank, "f16", heap.device)
    a_mm = torch.cat([a] * world) if pattern == "ag" else a  # the rank's whole GEMM
    rows: dict[str, dict] = {}

    def time_one(name, prog, how):
        t0 = time.time()
        if how == "matmul":
            t = time_op(lambda: torch.matmul(a_mm, b), heap, iters, 3, host_iters=1)
            out = None
        elif how == "devbar":
            t, out = _devbar_timing(prog, heap, iters, {"A": a, "B": b})
        else:
            t, out, _ = _tilec_timing(prog, heap, iters, {"A": a, "B": b}, 1)
        r = rows.setdefault(name, {"rounds_us": [], "how": t.how})
        r["rounds_us"].append(round(t.device_us, 1))
        r["spread_us"] = [round(x, 1) for x in (t.p10_us, t.p90_us)]
        if out is not None and ref is not None:
            r["rel_err"] = rel_err(out, ref)
        r.setdefault("wall_s", []).append(round(time.time() - t0, 1))

    order = [("matmul", None, "matmul"), *progs]
    for name, prog, how in order:
        time_one(name, prog, how)
    for name, prog, how in reversed(order):  # the second round in reverse order
        time_one(name, prog, how)
    out = {"rows": rows}
    if timelines:
        out["timelines"] = {}  # one by one: rank_timelines keys by schedule, and the A/B build is a fused-push
        for name, p in timelines:
            t = rank_timelines(heap, [p])[p.schedule]
            out["timelines"][name] = {"text": t.render(), "total_us": t.total_ns / 1e3,
                                      "between_us": t.between_ns / 1e3,
                                      "stages": {k.name: [(s, n, w / n / 1e3, wt / n / 1e3, (last - first) / 1e3)
                                                          for s, n, w, wt, first, last in k.per_stage]
                                                 for k in t.kernels},
                                      "programs": {k.name: k.programs for k in t.kernels}}
    return out


def main() -> None:
    from tilec.cli.args import _dims
    from tilec.perf.auto import machine, rank_schedules
    from tilec.perf.bench import measured_tiles
    from tilec.perf.bench_baselines import gemm_pattern
    from tilec.perf.measure import gpu_sharing, sharing_note
    from tilec.run_vs_reference import heap_bytes_for
    from tilec.runtime import spawn

    path, world, out_path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    timeline = "--timeline" in sys.argv[4:]
    dims = {"M": 8192, "N": 4608, "K": 36864} | _dims([a for a in sys.argv[4:] if "=" in a])  # -D M=.. or M=..
    dims, launch, text = measured_tiles(path, world, dims, {})
    print(text, flush=True)
    pattern = gemm_pattern(path, world, dims)
    t0 = time.time()
    m = machine(world)
    predicted = dict(rank_schedules(path, world, dims, m, launch=launch))
    auto = min(predicted, key=predicted.get)
    print(f"model ({m.name}, {m.link} link): "
          + ", ".join(f"{s} {us:.0f}" for s, us in sorted(predicted.items(), key=lambda x: x[1]))
          + f" us; auto picks {auto} ({time.time() - t0:.0f} s)", flush=True)
    progs = cases(path, world, dims, launch, pattern)
    if auto not in [n for n, _p, _h in progs]:
        progs.append((f"auto: {auto}", _compile(path, world, auto, dims, launch), "bench"))
    tl = []
    if timeline:
        for name, _p, _how in progs:
            if name in ("bsp", "fused-push", "fused-push (program-major)", "fused-push (owners in rank order)"):
                src = next(p for n, p, _ in progs if n == name)
                build = _compile(path, world, src.schedule, dims, {**launch, "timeline": True})
                if name.endswith("(program-major)"):
                    build = dataclasses.replace(build, source=re.sub(COPY_ORDER, "gather_task(copied, ", build.source)
                                                .replace("if not CLAIM:", "if True:"), _state={})
                if name.endswith("(owners in rank order)"):
                    build = dataclasses.replace(build, source=re.sub(
                        r"gemm_task\(\(task \+ \(rank \+ 1\) \* \d+\) % \d+, ", "gemm_task(task, ", build.source),
                        _state={})
                tl.append((name, build))
    # one program's tensors at a time (each timing releases its heap space, as tilec bench's do), the inputs, the ref
    heap_bytes = 2 * max(heap_bytes_for(p) for p in [*(p for _n, p, _h in progs), *(p for _n, p in tl)])
    heap_bytes += 4 * sum(dims[x] * dims[y] for x, y in (("M", "K"), ("K", "N"), ("M", "N")))
    per_rank = spawn(rank, world, backend="iris", heap_bytes=heap_bytes, timeout=1800,
                     args=(pattern, dims, progs, tl, ITERS))
    rows = []
    for name, _p, _how in [("matmul", None, "matmul"), *progs]:
        rs = [r["rows"][name] for r in per_rank]
        slowest = max(min(r["rounds_us"]) for r in rs)  # per rank its faster round; the call: the slowest rank
        sched = name.split(": ")[-1].split(" (")[0]
        rows.append({"name": name, "device_us": slowest, "per_rank_us": [min(r["rounds_us"]) for r in rs],
                     "rounds_us": [r["rounds_us"] for r in rs], "timing": rs[0]["how"],
                     "rel_err": max((r.get("rel_err") or 0.0) for r in rs) if name != "matmul" else None,
                     "predicted_us": predicted.get(sched) if name != "matmul" and "(" not in name else None})
    base = {r["name"]: r["device_us"] for r in rows}
    for r in rows:
        r["vs_tilec_bsp"] = round(base["bsp"] / r["device_us"], 3)
        r["vs_bsp_device_barriers"] = round(base["bsp (device barriers, graph)"] / r["device_us"], 3)
        r["vs_matmul"] = round(r["device_us"] / base["matmul"], 3)
        if r.get("predicted_us"):
            r["model_error"] = round(r["predicted_us"] / r["device_us"] - 1, 3)
    meta = {"program": path, "world": world, "dims": dims, "launch": launch, "gpu": torch.cuda.get_device_name(0),
            "sharing": gpu_sharing(world), "note": sharing_note(world), "tiles": text, "auto_pick": auto,
            "iters": ITERS, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "device_us": "per rank the faster of two rounds' medians (graph replays or events, L2 flushed by a read "
                         "and a cross-rank barrier before each, outside the events); the row: the slowest rank",
            "command": f"sh benchmarks/runs/mps_world.sh --spawn {world} python3 benchmarks/runs/mps_fused.py {path}"
                       f" {world} OUT" + (" --timeline" if timeline else "")}
    result = {"meta": meta, "rows": rows}
    if tl:
        result["timelines"] = [r["timelines"] for r in per_rank]
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"{'row':<34}{'device us':>10}{'x bsp':>8}{'x bsp-dev':>10}{'/ matmul':>10}{'model':>9}  rel err",
          flush=True)
    for r in rows:
        pred = f"{r['predicted_us']:.0f}" if r.get("predicted_us") else "-"
        err = f"{r['rel_err']:.1e}" if r.get("rel_err") is not None else ""
        print(f"{r['name']:<34}{r['device_us']:>10.0f}{r['vs_tilec_bsp']:>8.3f}{r['vs_bsp_device_barriers']:>10.3f}"
              f"{r['vs_matmul']:>10.3f}{pred:>9}  {err}   per rank {r['per_rank_us']}", flush=True)
    for i, t in enumerate(result.get("timelines", [])):
        for name, x in t.items():
            print(f"rank {i} timeline {name}: {x['text']}", flush=True)


if __name__ == "__main__":
    main()
