"""One GPU split by MPS: tilec's bsp and fused schedules of a GEMM program beside the concurrent plain torch.matmul of
the same per-rank work, all timed in one run (every rank at once, a cross-rank barrier and an L2 flush that reads
before each timed run, outside the CUDA events; CUDA graph replays where the op can be captured).

  sh benchmarks/runs/mps_world.sh --spawn W python3 benchmarks/runs/mps_fused.py PROGRAM W OUT.json [--timeline]
  sh benchmarks/runs/mps_world.sh --spawn W python3 benchmarks/runs/mps_fused.py PROGRAM W OUT_DIR --shapes paper \
      [--skip devbar,ab] [--time-budget SECONDS]

PROGRAM: examples/ag_gemm.tile or examples/gemm_rs.tile, by default at the paper shape 8192x4608x36864 (-D M=.. N=..
K=.. after OUT.json to change it; with --shapes, -D tiles apply to every shape), tilec bench's first Hopper config
for the shape (128x256x64 tiles, 8 warps, 3 stages, group_m 8 on these shapes) unless -D BM=.. BN=.. BK=.. are given.
--shapes paper: every shape of tilec.perf.bench.SHAPES["paper"] (M x N x K: 1024x3584x8192, 8192x4608x36864,
  8192x3584x14336, 8192x11008x4096, 8192x28672x8192) in one process (the ranks start and set up their heap once);
  --shapes paper:1,3 only those (0-based indices). Writes OUT_DIR/<program>_w<W>_<M>_<N>_<K>.json per shape, each
  in the one-shape format (what mps_fused_plot.py, mps_paper_summary.py and tests/test_mps_rows.py read; the summary
  wants the device-barrier bsp row: no --skip devbar for it). A shape that fails records its error (meta.error, and
  the row's error where one row failed) and the run goes on with the next.
--skip devbar,ab,matmul,timeline: leave out the device-barrier bsp, the A/B rows of task orders, the concurrent matmul,
  the timeline builds (to save device time).
--time-budget SECONDS: start no new shape once this many seconds have passed since the start, or when the last
  shape's time would not fit in what is left; with a budget the ranks are also stopped at budget + 120 s. Each rank
  keeps what it measured in a parts folder as it goes (OUT.json.parts/, or OUT_DIR/parts/), and the JSON files are
  written from it at the end, also after a failed or stopped run (the folder is removed once every shape is written
  without an error); `python3 benchmarks/runs/mps_fused.py --assemble OUT.json|OUT_DIR` writes them from the parts
  a killed run left.
--iters N (12), --backend cpu (the Triton interpreter: a CPU smoke run at small -D dims, with --skip devbar).
Run from the repository root with tilec importable (PYTHONPATH=$PWD, as the results' README does).

How long a shape takes (an estimate: the committed logs, benchmarks/results/h200-1gpu-mps/fused_vs_bsp/*.log, time
only the model, 1-9 s per shape; it runs twice per shape here, for the rows and for auto's ranking, all shapes in the
parent before the ranks start). The timed work is small: per row 2 rounds x (12 + 3 warm-up) calls, each after a
flush and a barrier (~2 ms); the model's per-rank GEMM times at W=2 are 0.16, 7.4, 2.2, 2.0 and 10 ms for the five
shapes in the order above (AG; RS a W-th of that; W=4 about twice), so the rows take ~1-10 s a shape. The rest is
Triton compiling each row's kernels on every rank: ~6 programs a shape with every row (bsp's two kernels, the fused
kernels, 1-2 A/B sources, auto's pick when it is another), ~3-4 with --skip devbar,ab, at ~5-20 s each (the fused
kernels longest). Expect ~1-2 min per shape with every row, about half that with --skip devbar,ab, plus ~30 s of
start-up (MPS daemon, the ranks, their heap) once per run: the five paper shapes of one program and world should fit
one 10-minute device call with --skip devbar,ab --time-budget 480; the per-shape wall times this run prints (and
meta.wall_s, each row's wall_s) say what fits the next call. For AG and RS at W=2 and 4:
  sh benchmarks/runs/mps_world.sh --spawn 2 python3 benchmarks/runs/mps_fused.py examples/ag_gemm.tile 2 \
      "$OUT/ag_gemm_w2" --shapes paper --skip devbar,ab --time-budget 480
  sh benchmarks/runs/mps_world.sh --spawn 4 python3 benchmarks/runs/mps_fused.py examples/ag_gemm.tile 4 \
      "$OUT/ag_gemm_w4" --shapes paper --skip devbar,ab --time-budget 480
  sh benchmarks/runs/mps_world.sh --spawn 2 python3 benchmarks/runs/mps_fused.py examples/gemm_rs.tile 2 \
      "$OUT/gemm_rs_w2" --shapes paper --skip devbar,ab --time-budget 480
  sh benchmarks/runs/mps_world.sh --spawn 4 python3 benchmarks/runs/mps_fused.py examples/gemm_rs.tile 4 \
      "$OUT/gemm_rs_w4" --shapes paper --skip devbar,ab --time-budget 480
and the shapes a budget left out in a next call with --shapes paper:I,J,.. (their indices, printed).

Rows (two rounds, the second in reverse order; each row keeps its faster median):
- bsp as tilec bench times it (a host barrier between its kernels: CUDA events around an eager call), and bsp with
  device barriers (device_epoch + device_barrier, one CUDA graph): the stronger bsp;
- fused-pull (ag), fused-push, and what `--schedule auto` picks (the cost model, MPS machine) when it is another;
- ag only: fused-push with its copies in destination order (0, 1, ..: before they went in the order the peers read
  them), and with that and the program-major remap forced under claims (the order before it was task-major): A/Bs
  of the task order in the same run; rs: fused-push with every rank pushing to rank 0 first (owners in rank order);
- matmul: torch.matmul of the rank's whole GEMM (ag: [M, K] @ [K, N]; rs: its K-shard [M, K/W] @ [K/W, N]) run by
  every rank at once: the compute-only bound the targets name;
- the cost model's prediction of every schedule (tilec.perf.auto.rank_schedules on the MPS machine): predicted_us
  of a call as the rows time it (no entry and exit barriers), meta.model the ranking `auto` makes (with them).
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


def cases(path: str, world: int, dims: dict, launch: dict, pattern: str, skip: frozenset = frozenset()
          ) -> list[tuple[str, object, str]]:
    """(row name, program, how it is timed: bench | devbar); skip: "devbar" and/or "ab" rows left out."""
    names = ["bsp", "fused-pull", "fused-push"] if pattern == "ag" else ["bsp", "fused-push"]
    out = [(s, _compile(path, world, s, dims, launch), "bench") for s in names]
    bsp = out[0][1]
    if "devbar" not in skip:
        out.insert(1, ("bsp (device barriers, graph)", dataclasses.replace(bsp, _state={}), "devbar"))
    if "ab" in skip:
        return out
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


def _shape_rank(heap, job: dict, iters: int, say) -> dict:
    """One shape's rows on this rank: {"rows": {name: ...}, "timelines": ...}; a row that raises keeps its error."""
    from tilec.perf.bench import _tilec_timing
    from tilec.perf.inputs import gemm_inputs, gemm_reference
    from tilec.perf.measure import time_op
    from tilec.perf.rows import rel_err
    from tilec.perf.timeline import rank_timelines

    world, pattern, dims = heap.world, job["pattern"], job["dims"]
    a, b = gemm_inputs(pattern, dims, world, heap.rank, "f16", heap.device)
    ref = gemm_reference(pattern, dims, world, heap.rank, "f16", heap.device)
    a_mm = torch.cat([a] * world) if pattern == "ag" else a  # the rank's whole GEMM
    rows: dict[str, dict] = {}

    def time_one(name, prog, how):
        t0 = time.time()
        r = rows.setdefault(name, {"rounds_us": []})
        try:
            if how == "matmul":
                t = time_op(lambda: torch.matmul(a_mm, b), heap, iters, 3, host_iters=1)
                out = None
            elif how == "devbar":
                t, out = _devbar_timing(prog, heap, iters, {"A": a, "B": b})
            else:
                t, out, _ = _tilec_timing(prog, heap, iters, {"A": a, "B": b}, 1)
        except Exception as e:  # noqa: BLE001 - the row records it; the run goes on
            r.setdefault("error", f"{type(e).__name__}: {e}"[:500])
            say(f"  {name}: {type(e).__name__}: {str(e)[:200]}")
            return
        finally:
            r.setdefault("wall_s", []).append(round(time.time() - t0, 1))
        r["how"] = t.how
        r["rounds_us"].append(round(t.device_us, 1))
        r["spread_us"] = [round(x, 1) for x in (t.p10_us, t.p90_us)]
        if out is not None and ref is not None:
            r["rel_err"] = rel_err(out, ref)
        say(f"  {name}: {t.device_us:.0f} us ({r['wall_s'][-1]:.0f} s)")

    order = ([] if "matmul" in job["skip"] else [("matmul", None, "matmul")]) + job["progs"]
    for name, prog, how in order:
        time_one(name, prog, how)
    for name, prog, how in reversed(order):  # the second round in reverse order
        time_one(name, prog, how)
    out = {"rows": rows}
    if job["timelines"]:
        out["timelines"] = {}  # one by one: rank_timelines keys by schedule, and the A/B build is a fused-push
        for name, p in job["timelines"]:
            t = rank_timelines(heap, [p])[p.schedule]
            out["timelines"][name] = {"text": t.render(), "total_us": t.total_ns / 1e3,
                                      "between_us": t.between_ns / 1e3,
                                      "stages": {k.name: [(s, n, w / n / 1e3, wt / n / 1e3, (last - first) / 1e3)
                                                          for s, n, w, wt, first, last in k.per_stage]
                                                 for k in t.kernels},
                                      "programs": {k.name: k.programs for k in t.kernels}}
    return out


def rank(heap, jobs: list[dict], iters: int, parts: str, start: float, budget: float | None) -> list[int]:
    """Every shape in turn on this rank, each kept in PARTS/shape<i>.rank<r>.json once done; before each the ranks
    agree (rank 0's word at a barrier) whether the time budget leaves room for it. Returns the shapes it ran."""
    from pathlib import Path

    def say(msg):
        if heap.rank == 0:
            print(f"[{time.time() - start:6.0f} s] {msg}", flush=True)

    done, last = [], 0.0
    for job in jobs:
        left = None if budget is None else budget - (time.time() - start)
        go = heap.barrier(int(left is None or left > last))[0]  # rank 0's decision for every rank
        if not go:
            say(f"time budget: shape {job['index']} and later not started ({left:.0f} s left, the last shape "
                f"took {last:.0f} s)")
            break
        t0 = time.time()
        say(f"shape {job['index']} {job['tag']}: {len(job['progs'])} programs")
        try:
            res = _shape_rank(heap, job, iters, say)
        except Exception as e:  # noqa: BLE001 - the shape records it; the run goes on
            res = {"rows": {}, "error": f"{type(e).__name__}: {e}"[:1000]}
            say(f"  shape {job['index']} failed: {res['error'][:300]}")
        res["wall_s"] = round(time.time() - t0, 1)
        Path(parts, f"shape{job['index']}.rank{heap.rank}.json").write_text(json.dumps(res))
        last = res["wall_s"]
        say(f"shape {job['index']} done in {last:.0f} s")
        done.append(job["index"])
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return done


def assemble(parts: str) -> list[str]:
    """Write each shape's JSON (its meta from the parent, rows from every rank's part) from a parts folder; returns
    the paths written. A shape no rank finished is left out; rows some rank lacks keep that rank's error."""
    from pathlib import Path

    written = []
    for meta_file in sorted(Path(parts).glob("shape*.meta.json"), key=lambda p: int(p.name[5:].split(".")[0])):
        job = json.loads(meta_file.read_text())
        idx, meta = job["index"], job["meta"]
        ranks = [Path(parts, f"shape{idx}.rank{r}.json") for r in range(meta["world"])]
        if not any(p.exists() for p in ranks):
            continue
        per_rank = [json.loads(p.read_text()) if p.exists() else {"rows": {}, "error": "no part (not finished)"}
                    for p in ranks]
        errors = sorted({r["error"] for r in per_rank if r.get("error")})
        rows = []
        for name in job["names"]:
            rs = [r["rows"].get(name) or {} for r in per_rank]
            if not all(r.get("rounds_us") for r in rs):
                errs = sorted({r.get("error", "not timed") for r in rs if not r.get("rounds_us")})
                if any(rs):
                    rows.append({"name": name, "device_us": None, "error": "; ".join(errs)})
                continue
            slowest = max(min(r["rounds_us"]) for r in rs)  # per rank its faster round; the call: the slowest rank
            sched = name.split(": ")[-1]
            row = {"name": name, "device_us": slowest, "per_rank_us": [min(r["rounds_us"]) for r in rs],
                   "rounds_us": [r["rounds_us"] for r in rs], "timing": rs[0].get("how"),
                   "rel_err": max((r.get("rel_err") or 0.0) for r in rs) if name != "matmul" else None,
                   "predicted_us": job["predicted"].get(sched) if "(" not in sched else None,
                   "wall_s": max(sum(r.get("wall_s", [])) for r in rs)}
            if any(r.get("error") for r in rs):
                row["error"] = "; ".join(sorted({r["error"] for r in rs if r.get("error")}))
            rows.append(row)
        base = {r["name"]: r["device_us"] for r in rows if r.get("device_us")}
        for r in rows:
            if not r.get("device_us"):
                continue
            for key, ref in (("vs_tilec_bsp", "bsp"), ("vs_bsp_device_barriers", "bsp (device barriers, graph)")):
                if ref in base:
                    r[key] = round(base[ref] / r["device_us"], 3)
            if "matmul" in base:
                r["vs_matmul"] = round(r["device_us"] / base["matmul"], 3)
            if r.get("predicted_us"):
                r["model_error"] = round(r["predicted_us"] / r["device_us"] - 1, 3)
        meta = {**meta, "wall_s": max(r.get("wall_s", 0.0) for r in per_rank)}
        if errors:
            meta["error"] = "; ".join(errors)
        result = {"meta": meta, "rows": rows}
        if any("timelines" in r for r in per_rank):
            result["timelines"] = [r.get("timelines", {}) for r in per_rank]
        Path(job["out"]).write_text(json.dumps(result, indent=1))
        written.append(job["out"])
        _print(result)
    return written


def _print(result: dict) -> None:
    m = result["meta"]
    error = f": {m['error']}" if "error" in m else ""
    print(f"{m['program']} world {m['world']} {m['dims']} ({m['wall_s']:.0f} s){error}", flush=True)
    print(f"{'row':<34}{'device us':>10}{'x bsp':>8}{'x bsp-dev':>10}{'/ matmul':>10}{'model':>9}  rel err",
          flush=True)
    for r in result["rows"]:
        if not r.get("device_us"):
            print(f"{r['name']:<34}{'-':>10}  {r.get('error', '')[:200]}", flush=True)
            continue
        pred = f"{r['predicted_us']:.0f}" if r.get("predicted_us") else "-"
        err = f"{r['rel_err']:.1e}" if r.get("rel_err") is not None else ""
        ratios = "".join(f"{r[k]:>{w}.3f}" if k in r else f"{'-':>{w}}"
                         for k, w in (("vs_tilec_bsp", 8), ("vs_bsp_device_barriers", 10), ("vs_matmul", 10)))
        print(f"{r['name']:<34}{r['device_us']:>10.0f}{ratios}{pred:>9}  {err}   per rank {r['per_rank_us']}",
              flush=True)
    for i, t in enumerate(result.get("timelines", [])):
        for name, x in t.items():
            print(f"rank {i} timeline {name}: {x['text']}", flush=True)


def _shape_list(spec: str | None, given: dict) -> list[dict]:
    """--shapes paper[:I,J] -> the dims of each shape; None -> the one shape (paper 8192x4608x36864, -D overrides)."""
    from tilec.perf.bench import SHAPES

    if spec is None:
        return [{"M": 8192, "N": 4608, "K": 36864} | given]
    name, _, picks = spec.partition(":")
    if name not in SHAPES:
        raise SystemExit(f"mps_fused.py: --shapes {spec}: expected one of {', '.join(SHAPES)}[:I,J,..]")
    shapes = SHAPES[name]
    try:
        idx = [int(i) for i in picks.split(",")] if picks else list(range(len(shapes)))
        chosen = [shapes[i] for i in idx]
    except (ValueError, IndexError):
        raise SystemExit(f"mps_fused.py: --shapes {spec}: indices 0..{len(shapes) - 1}, comma-separated") from None
    tiles = {k: v for k, v in given.items() if k not in ("M", "N", "K")}
    return [{"M": m, "N": n, "K": k} | tiles for m, n, k in chosen]


def _parse(argv: list[str]) -> dict:
    import argparse

    ap = argparse.ArgumentParser(prog="mps_fused.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("program")
    ap.add_argument("world", type=int)
    ap.add_argument("out", help="OUT.json (one shape) or a folder (--shapes)")
    ap.add_argument("dims", nargs="*", help="M=.. N=.. K=.. BM=.. (also as -D NAME=INT)")
    ap.add_argument("-D", dest="defs", action="append", default=[])
    ap.add_argument("--timeline", action="store_true")
    ap.add_argument("--shapes")
    ap.add_argument("--skip", default="", help="comma-separated: devbar, ab, matmul, timeline")
    ap.add_argument("--time-budget", type=float)
    ap.add_argument("--iters", type=int, default=ITERS)
    ap.add_argument("--backend", default="iris", choices=("iris", "cpu"))
    a = ap.parse_intermixed_args(argv)
    skip = frozenset(x for x in a.skip.split(",") if x)
    unknown = skip - {"devbar", "ab", "matmul", "timeline"}
    if unknown:
        ap.error(f"--skip {','.join(sorted(unknown))}: expected devbar, ab, matmul, timeline")
    return vars(a) | {"skip": skip}


def main(argv: list[str] | None = None) -> None:
    from pathlib import Path

    from tilec.cli.args import _dims
    from tilec.perf.auto import machine, rank_schedules
    from tilec.perf.bench import measured_tiles
    from tilec.perf.bench_baselines import gemm_pattern
    from tilec.perf.measure import gpu_sharing, sharing_note
    from tilec.run_vs_reference import heap_bytes_for
    from tilec.runtime import spawn

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--assemble"]:
        out = Path(argv[1])
        parts = out if out.name.endswith(".parts") else Path(f"{out}.parts") if out.suffix == ".json" else out / "parts"
        print("\n".join(assemble(str(parts))) or f"mps_fused.py: nothing to assemble in {parts}", flush=True)
        return
    a = _parse(argv)
    path, world, out = a["program"], a["world"], Path(a["out"])
    skip, timeline = a["skip"], a["timeline"] and "timeline" not in a["skip"]
    start = time.time()
    given = _dims(a["dims"] + a["defs"])
    shapes = _shape_list(a["shapes"], given)
    many = a["shapes"] is not None
    if many:
        out.mkdir(parents=True, exist_ok=True)
    parts = out / "parts" if many else Path(f"{out}.parts")
    parts.mkdir(parents=True, exist_ok=True)
    for old in parts.glob("shape*.json"):
        old.unlink()
    m = machine(world)
    jobs, heap_bytes = [], 1 << 24
    for i, shape in enumerate(shapes):
        tag = "x".join(str(shape[d]) for d in ("M", "N", "K"))
        name = "_".join(str(shape[d]) for d in ("M", "N", "K"))  # as paper_shapes/ names them
        target = str(out / f"{Path(path).stem}_w{world}_{name}.json") if many else str(out)
        t0 = time.time()
        try:
            dims, launch, text = measured_tiles(path, world, shape, {})
            pattern = gemm_pattern(path, world, dims)
            ranking = rank_schedules(path, world, dims, m, launch=launch)
            timed = dict(rank_schedules(path, world, dims, m, launch=launch, entry_barrier=False))
            auto = ranking[0][0]
            progs = cases(path, world, dims, launch, pattern, skip)
            if auto not in [n for n, _p, _h in progs]:
                progs.append((f"auto: {auto}", _compile(path, world, auto, dims, launch), "bench"))
            tl = []
            for name, src, _how in progs if timeline else []:
                if name in ("bsp", "fused-push", "fused-push (program-major)", "fused-push (owners in rank order)"):
                    build = _compile(path, world, src.schedule, dims, {**launch, "timeline": True})
                    if name.endswith("(program-major)"):
                        build = dataclasses.replace(build, source=re.sub(COPY_ORDER, "gather_task(copied, ",
                                                                         build.source)
                                                    .replace("if not CLAIM:", "if True:"), _state={})
                    if name.endswith("(owners in rank order)"):
                        build = dataclasses.replace(build, source=re.sub(
                            r"gemm_task\(\(task \+ \(rank \+ 1\) \* \d+\) % \d+, ", "gemm_task(task, ",
                            build.source), _state={})
                    tl.append((name, build))
        except Exception as e:  # noqa: BLE001 - the shape records it; the run goes on
            print(f"shape {i} {tag}: not compiled: {type(e).__name__}: {e}", flush=True)
            Path(target).write_text(json.dumps({"meta": {"program": path, "world": world, "dims": shape,
                                                         "error": f"{type(e).__name__}: {e}"[:1000]}, "rows": []},
                                               indent=1))
            continue
        print(f"shape {i} {tag}: {text}", flush=True)
        print(f"  model ({m.name}, {m.link} link): " + ", ".join(f"{s} {us:.0f}" for s, us in ranking)
              + f" us; auto picks {auto} ({time.time() - t0:.0f} s)", flush=True)
        # one program's tensors at a time (each timing releases its heap space, as tilec bench's do), the inputs
        need = 2 * max(heap_bytes_for(p) for p in [*(p for _n, p, _h in progs), *(p for _n, p in tl)])
        heap_bytes = max(heap_bytes, need + 4 * sum(dims[x] * dims[y] for x, y in (("M", "K"), ("K", "N"),
                                                                                   ("M", "N"))))
        names = ([] if "matmul" in skip else ["matmul"]) + [n for n, _p, _h in progs]
        cmd = (f"sh benchmarks/runs/mps_world.sh --spawn {world} python3 benchmarks/runs/mps_fused.py {path} {world} "
               + (f"OUT_DIR --shapes {a['shapes']}" if many else "OUT") + (" --timeline" if timeline else "")
               + (f" --skip {','.join(sorted(skip))}" if skip else ""))
        meta = {"program": path, "world": world, "dims": dims, "launch": launch, "shape_index": i,
                "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
                "sharing": gpu_sharing(world), "note": sharing_note(world), "tiles": text, "auto_pick": auto,
                "model": {s: round(us, 1) for s, us in ranking}, "iters": a["iters"], "torch": torch.__version__,
                "date": time.strftime("%Y-%m-%d %H:%M:%S"),
                "device_us": "per rank the faster of two rounds' medians (graph replays or events, L2 flushed by a "
                             "read and a cross-rank barrier before each, outside the events); the row: the slowest "
                             "rank",
                "predicted_us": "the cost model's time of a call as the rows time it (no entry and exit barriers); "
                                "model: auto's ranking (calls with them)",
                "command": cmd}
        Path(parts, f"shape{i}.meta.json").write_text(json.dumps({"index": i, "out": target, "meta": meta,
                                                                 "names": names, "predicted": timed}))
        jobs.append({"index": i, "tag": tag, "pattern": pattern, "dims": dims, "progs": progs, "timelines": tl,
                     "skip": skip})
    budget = a["time_budget"]
    if jobs:
        print(f"{len(jobs)} shape(s) compiled and modelled in {time.time() - start:.0f} s; ranks start", flush=True)
        try:
            spawn(rank, world, backend=a["backend"], heap_bytes=heap_bytes,
                  timeout=1800 if budget is None else budget + 120,
                  args=(jobs, a["iters"], str(parts), start, budget))
        except Exception as e:  # noqa: BLE001 - what the ranks finished is still written
            print(f"mps_fused.py: the ranks stopped: {type(e).__name__}: {str(e)[:500]}", flush=True)
    written = assemble(str(parts))
    if len(written) == len(jobs) and not any("error" in json.loads(Path(w).read_text())["meta"] for w in written):
        for p in parts.glob("*.json"):
            p.unlink()
        parts.rmdir()
    print(f"wrote {len(written)} of {len(shapes)} shape(s): " + ", ".join(written) + f" ({time.time() - start:.0f} s)",
          flush=True)


if __name__ == "__main__":
    main()
