"""`tilec bench`: every tilec schedule beside the external baselines, in one run, with the same barrier discipline.

Each rank times each candidate with CUDA events around the call only; a cross-rank barrier precedes every
iteration (outside the timed region, for tilec and baselines alike). Reported: median time, TFLOP/s and the
ratio to the best baseline of the row. Tile configs are tuned per (program, schedule, shape, world, GPU) by short
timed trials and cached. Results: JSON + a plot under benchmarks/results/<machine>/.

The benchmark family comes from the program's dims: M, N, K -> All-Gather + GEMM (this module, shape sets SHAPES);
B, HKV, G, D, S -> distributed flash decode (tilec.perf.bench_decode, shape sets DECODE_SHAPES, GB/s of KV streamed).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from tilec.errors import ScheduleError, TilecError
from tilec.passes.schedules import SCHEDULES
from tilec.perf.inputs import bench_inputs
from tilec.perf.measure import gpu_name, median_time, tune_cache
from tilec.runtime import under_torchrun

SHAPES = {
    "paper": [(1024, 3584, 8192), (8192, 4608, 36864), (8192, 3584, 14336), (8192, 11008, 4096),
              (8192, 28672, 8192)],
    "square": [(8192, 8192, 8192)],
    "decode": [(1, 8192, 8192), (16, 8192, 8192), (64, 8192, 8192), (256, 8192, 8192)],
    "small": [(256, 256, 256), (512, 384, 256)],
}
# (BM, BN, BK, num_warps, num_stages, group_m): Hopper-friendly configs for pointer-based tl.dot GEMMs
CONFIGS = [
    (128, 256, 64, 8, 3, 8),
    (128, 256, 64, 8, 4, 8),
    (256, 128, 64, 8, 3, 8),
]
SMALL_M_CONFIGS = [(64, 128, 64, 4, 4, 8), (64, 256, 64, 8, 3, 8)]  # M <= 64: shorter tiles waste fewer rows
CPU_CONFIGS = [(64, 64, 32, 4, 1, 8)]


@dataclass
class Row:
    program: str
    shape: dict
    world: int
    dtype: str
    name: str  # schedule or baseline
    kind: str  # tilec | baseline
    median_us: float
    tflops: float
    config: dict = field(default_factory=dict)
    ratio_to_best_baseline: float | None = None
    note: str = ""


def _flops(prog_dims: dict, flops_expr: str | None) -> float:
    if flops_expr:
        return float(eval(flops_expr, {}, dict(prog_dims)))  # noqa: S307 - a formula of the user's dims
    return 2.0 * prog_dims["M"] * prog_dims["N"] * prog_dims["K"]


def bench_rank(heap, path: str, shapes: list[tuple[int, int, int]], world: int, schedules: list[str],
               dtype: str, iters: int, tune: bool, log) -> list[dict]:
    """Runs on every rank; returns rows (rank 0's are the ones reported)."""
    import tilec
    from tilec.perf.bench_baselines import baselines, gemm_pattern

    rows: list[Row] = []
    cache = json.loads(tune_cache().read_text()) if tune_cache().exists() else {}
    src_hash = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]
    all_configs = CPU_CONFIGS if heap.interpret else CONFIGS
    retype = {"f16": dtype} if dtype != "f16" else None
    total = len(shapes) * (len(schedules) + 1)
    step = 0
    for (m, n, k) in shapes:
        dims = {"M": m, "N": n, "K": k}
        pattern = gemm_pattern(path, world, dims)
        flops = _flops(dims, None) / (world if pattern != "ag" else 1)  # rs/ar: each rank multiplies a K-shard
        shape_rows: list[Row] = []
        mark = heap.mark()
        base = baselines(heap, dims, world, dtype, iters, median_time, pattern)
        for name, secs, note in base:
            shape_rows.append(Row(Path(path).stem, dims, world, dtype, name, "baseline", secs * 1e6,
                                  flops / secs / 1e12, note=note))
        step += 1
        log(f"[{step}/{total}] {dims} baselines: " + ", ".join(f"{r.name} {r.median_us:.0f}us" for r in shape_rows))
        for s in schedules:
            step += 1
            key = f"{src_hash}|{s}|{m}x{n}x{k}|w{world}|{dtype}|{gpu_name()}"
            configs = all_configs if heap.interpret or m > 64 else SMALL_M_CONFIGS
            cands = [tuple(cache[key])] if key in cache else (configs if tune else configs[:1])
            best = None
            for cfg in cands:
                bm, bn, bk, nw, ns, gm = cfg
                try:
                    prog = tilec.compile(path, world=world, schedule=s, retype=retype, group_m=gm, num_warps=nw,
                                         num_stages=ns, dims={**dims, "BM": bm, "BN": bn, "BK": bk})
                except ScheduleError as e:
                    best = ("skip", str(e))
                    break
                inner = heap.mark()
                args = bench_inputs(prog, heap, 0)
                try:
                    secs = median_time(lambda p=prog, a=args: p(heap, entry_barrier=False, sync=False, **a), heap,
                                        iters if len(cands) == 1 else max(3, iters // 3), 2)
                except Exception as e:  # a config that does not compile (shared memory) is skipped
                    log(f"    {s} {cfg}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    heap.release(inner)
                    continue
                if len(cands) > 1:
                    log(f"    tune {s} {cfg}: {secs * 1e6:.0f}us")
                if best is None or best[0] == "skip" or secs < best[1]:
                    best = (cfg, secs, prog, args)
                heap.release(inner)
            if best is None or best[0] == "skip":
                log(f"[{step}/{total}] {dims} {s}: skipped ({best[1] if best else 'no config ran'})")
                continue
            cfg, secs = best[0], best[1]
            per_sm = best[2].programs_per_sm(heap)
            cache[key] = list(cfg)
            if len(cands) > 1:  # re-time the winner with the full iteration count
                prog = tilec.compile(path, world=world, schedule=s, retype=retype, group_m=cfg[5],
                                     num_warps=cfg[3], num_stages=cfg[4],
                                     dims={**dims, "BM": cfg[0], "BN": cfg[1], "BK": cfg[2]})
                inner = heap.mark()
                args = bench_inputs(prog, heap, 0)
                secs = median_time(lambda p=prog, a=args: p(heap, entry_barrier=False, sync=False, **a), heap,
                                    iters, 2)
                heap.release(inner)
            conf = dict(zip(("BM", "BN", "BK", "num_warps", "num_stages", "group_m"), cfg, strict=True))
            conf["programs_per_sm"] = per_sm  # of the persistent kernels (occupancy, LaunchContext.fit)
            if heap.rank == 0:  # `--schedule auto` prefers measured times of this program, shape, world and GPU
                from tilec.perf.auto import key as auto_key
                from tilec.perf.auto import record_measured

                record_measured(auto_key(Path(path).read_text(), world, dims), s, secs * 1e6)
            shape_rows.append(Row(Path(path).stem, dims, world, dtype, s, "tilec", secs * 1e6, flops / secs / 1e12,
                                  conf))
            log(f"[{step}/{total}] {dims} {s}: {secs * 1e6:.0f}us {flops / secs / 1e12:.0f} TFLOP/s {conf}")
        heap.release(mark)
        best_base = min((r.median_us for r in shape_rows if r.kind == "baseline"), default=None)
        for r in shape_rows:
            if best_base:
                r.ratio_to_best_baseline = round(best_base / r.median_us, 4)
        rows += shape_rows
    if heap.rank == 0:
        tmp = tune_cache().with_suffix(".tmp")
        tmp.write_text(json.dumps(cache, indent=1, sort_keys=True))
        os.replace(tmp, tune_cache())
    return [asdict(r) for r in rows]


def save_results(rows: list[dict], out_dir: Path, tag: str, meta: dict) -> tuple[Path, Path | None]:
    out_dir.mkdir(parents=True, exist_ok=True)
    js = out_dir / f"{tag}.json"
    tmp = js.with_suffix(".tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    os.replace(tmp, js)
    png = out_dir / f"{tag}.png"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return js, None
    metric = meta.get("metric", "tflops")  # decode plots GB/s of KV streamed per rank

    def shape_of(r):
        return r.get("label") or "x".join(str(v) for v in r["shape"].values())

    shapes = list(dict.fromkeys(shape_of(r) for r in rows))
    names = list(dict.fromkeys(r["name"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(shapes)), 4))
    w = 0.8 / max(1, len(names))
    for i, nm in enumerate(names):
        ys = []
        for s in shapes:
            v = [r[metric] for r in rows if r["name"] == nm and shape_of(r) == s]
            ys.append(v[0] if v else 0)
        ax.bar([j + i * w for j in range(len(shapes))], ys, w, label=nm)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(shapes))], shapes, rotation=15, fontsize=8)
    if metric == "gbps":
        ax.set_ylabel("GB/s (KV bytes streamed per rank / time)")
        if meta.get("copy_gbps") and meta.get("backend") != "cpu":  # the CPU emulation is nowhere near it
            ax.axhline(meta["copy_gbps"], color="gray", linestyle="--", linewidth=0.8,
                       label=f"copy bandwidth {meta['copy_gbps']:.0f} GB/s")
    else:
        ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{tag} ({meta.get('gpu', '')}, world {meta.get('world')})", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return js, png


FAMILIES = {"gemm": ("M", "N", "K"), "decode": ("B", "HKV", "G", "D", "S")}


def program_family(path: str) -> str:
    """'gemm' for a program with dims M, N, K; 'decode' for one with B, HKV, G, D, S; else a TilecError."""
    from tilec.frontend.parser import parse_file

    ast = parse_file(path)
    have = {d.name for d in ast.dims}
    found = [f for f, need in FAMILIES.items() if set(need) <= have]
    if len(found) != 1:
        what = "both" if found else "neither"
        raise TilecError(f"{path}: tilec bench times All-Gather+GEMM programs (dims M, N, K, like "
                         "examples/ag_gemm.tile) or flash-decode programs (dims B, HKV, G, D, S and tile BS, like "
                         f"examples/flash_decode.tile); program {ast.name} has dims {', '.join(sorted(have)) or 'none'}"
                         f", {what} of those")
    return found[0]


def shape_sets(family: str) -> dict[str, list[tuple[int, ...]]]:
    if family == "decode":
        from tilec.perf.bench_decode import DECODE_SHAPES

        return DECODE_SHAPES
    return SHAPES


def machine_tag(world: int) -> str:
    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().lower()
    gpu = "h200" if "h200" in name else "h100" if "h100" in name else name.split()[-1]
    return f"{gpu}-{world}gpu" if world == 1 else f"{gpu}-x{world}"


def run_bench(path: str, world: int, shapes: str, schedules: list[str] | None, dtype: str, iters: int,
              tune: bool | None, out_dir: str | None, backend: str | None) -> list[dict]:
    """Times every schedule of `path` beside the baselines on the named shape sets (comma separated) and writes
    JSON + a plot. The family (GEMM or decode) and so the valid shape sets follow from the program's dims.
    tune: time several tile configs (cached); None: the family's default (GEMM: tune, decode: don't)."""
    from tilec.runtime import default_backend, spawn

    backend = backend or default_backend()
    family = program_family(path)
    sets = shape_sets(family)
    shape_list = []
    for s in shapes.split(","):
        if s not in sets:
            other = next((f for f in FAMILIES if f != family and s in shape_sets(f)), None)
            why = f" ({s} is a {other} set; {path} is a {family} program)" if other else ""
            raise TilecError(f"--shapes {s}: choose from {', '.join(sets)}{why}")
        shape_list += sets[s]
    schedules = schedules or list(SCHEDULES)
    if tune is None:
        tune = family == "gemm"
    if family == "decode":
        from tilec.perf.bench_decode import prepare

        heap_bytes = prepare(path, shape_list, world, dtype, backend == "cpu")
    else:
        heap_bytes = _heap_bytes(shape_list, world, dtype)
    log = _log
    if under_torchrun():  # this process is one rank
        from tilec.runtime import from_env

        heap = from_env(backend, heap_bytes)
        world = heap.world
        result = _bench_family(family, heap, path, shape_list, world, schedules, dtype, iters, tune,
                               log if heap.rank == 0 else lambda *_: None)
        if heap.rank != 0:
            return result["rows"] if family == "decode" else result
    else:
        results = spawn(_bench_spawned, world, backend=backend, heap_bytes=heap_bytes, timeout=3600,
                        args=(path, shape_list, world, schedules, dtype, iters, tune, family))
        result = results[0]
    rows, skipped = (result["rows"], result["skipped"]) if family == "decode" else (result, None)
    meta = {"program": path, "world": world, "gpu": gpu_name(), "dtype": dtype, "shapes": shapes,
            "torch": torch.__version__, "backend": backend, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "ranks_share_gpu": bool(torch.cuda.is_available() and world > torch.cuda.device_count()),
            "timing": "median of CUDA-event times per call; cross-rank barrier before each call, outside the timer"}
    if family == "decode":
        from tilec.perf.bench_decode import COPY_GBPS, MAX_SPLITS

        meta.update({"family": "decode", "metric": "gbps", "copy_gbps": COPY_GBPS, "max_splits": MAX_SPLITS,
                     "run_copy_gbps": "per row: a device copy of the shape's K timed in the same run (read + write"
                                      " bytes per second, as `tilec calibrate` counts them; a kernel time like"
                                      " local_us); None on the CPU",
                     "local_us": "per bsp row: its local phase alone (split + merge kernels), a kernel time:"
                                 " median of CUDA-event times of launches each after an L2 flush that reads a buffer"
                                 " of several L2s (tilec.perf.gpu_time.cold_time), as the run copy is timed",
                     "lens": "full: lens[b] = W * S", "tune": tune, "skipped": skipped,
                     "kv_bytes": "2 * B * S * HKV * D * element size, per rank per call",
                     "rel_err": "max |O - O_ref| / max |O_ref|; O_ref: the first baseline's output, else the whole"
                                " op in f32 (small shapes)"})
    tag = f"{Path(path).stem}_{shapes.replace(',', '+')}_{dtype}"
    out = Path(out_dir or f"benchmarks/results/{machine_tag(world)}")
    js, png = save_results(rows, out, tag, meta)
    _log(f"wrote {js}" + (f" and {png}" if png else ""))
    if family == "decode":
        from tilec.perf.bench_decode import table

        table(rows, skipped)
    else:
        _table(rows)
    return rows


def _bench_family(family, heap, path, shape_list, world, schedules, dtype, iters, tune, log):
    if family == "decode":
        from tilec.perf.bench_decode import bench_rank as decode_bench_rank

        return decode_bench_rank(heap, path, shape_list, world, schedules, dtype, iters, tune, log)
    return bench_rank(heap, path, shape_list, world, schedules, dtype, iters, tune, log)


def _bench_spawned(heap, path, shape_list, world, schedules, dtype, iters, tune, family="gemm"):
    return _bench_family(family, heap, path, shape_list, world, schedules, dtype, iters, tune,
                         _log if heap.rank == 0 else (lambda *_: None))


def _heap_bytes(shapes, world, dtype) -> int:
    esz = 4 if dtype == "f32" else 2
    worst = max(2 * m * k + k * n + m * n for m, n, k in shapes) * esz  # A shard, Ag, B, C, with slack
    return int(worst * 1.3) + (64 << 20)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _table(rows: list[dict]) -> None:
    print(f"{'shape':<22}{'name':<24}{'us':>10}{'TFLOP/s':>10}{'vs best baseline':>18}")
    for r in rows:
        shp = "x".join(str(v) for v in r["shape"].values())
        ratio = f"{r['ratio_to_best_baseline']:.3f}x" if r["ratio_to_best_baseline"] else "-"
        print(f"{shp:<22}{r['name']:<24}{r['median_us']:>10.1f}{r['tflops']:>10.1f}{ratio:>18}")
