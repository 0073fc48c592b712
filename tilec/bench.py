"""`tilec bench`: every tilec schedule beside the external baselines, in one run, with the same barrier discipline.

Each rank times each candidate with CUDA events around the call only; a cross-rank barrier precedes every
iteration (outside the timed region, for tilec and baselines alike). Reported: median time, TFLOP/s and the
ratio to the best baseline of the row. Tile configs are tuned per (program, schedule, shape, world, GPU) by short
timed trials and cached. Results: JSON + a plot under benchmarks/results/<machine>/.

The benchmark family comes from the program's dims: M, N, K -> All-Gather + GEMM (this module, shape sets SHAPES);
B, HKV, G, D, S -> distributed flash decode (tilec.bench_decode, shape sets DECODE_SHAPES, GB/s of KV streamed).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from tilec.errors import ScheduleError, TilecError
from tilec.passes.schedules import SCHEDULES
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
    rel_err: float | None = None  # tilec rows: max |C - C_ref| / max(1, max |C_ref|) of the timed calls' outputs


def _tune_cache() -> Path:
    from tilec.program import cache_dir

    return cache_dir() / "tune.json"


def load_tuned() -> dict:
    """The tuned tile configs recorded so far (key -> config), {} when none."""
    from tilec.fileio import read_json

    return read_json(_tune_cache())


def store_tuned(found: dict) -> None:
    """Merge this run's tuned configs into the cache under its lock (concurrent benches lose no record)."""
    from tilec.fileio import update_json

    if found:
        update_json(_tune_cache(), lambda d: d.update(found))


def _gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"


def _device_name(heap) -> str:
    """The device in tuning keys: the heap's GPU, or the CPU interpreter's key (never a GPU's: its tile configs
    and times would otherwise be read by a GPU's tuning)."""
    from tilec.auto import device_key

    return device_key(heap)


def _median_time(fn, heap, iters: int, warmup: int) -> float:
    """Median of per-call times (seconds); a barrier before each call, outside the timed region."""
    for _ in range(warmup):
        heap.barrier()
        fn()
    times = []
    for _ in range(iters):
        heap.barrier()
        if heap.interpret:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        else:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) / 1e3)
    return statistics.median(times)


def time_checked(prog, heap, args: dict, iters: int, warmup: int) -> float:
    """Median seconds of `prog` on `args` (tilec's timing discipline, _median_time), bracketed by synchronous
    calls: the first compiles and fails fast on a wait that never completes (WaitTimeout), the last raises one
    that timed out during the unsynchronized timed calls instead of letting it go unseen."""
    prog(heap, **args)
    secs = _median_time(lambda: prog(heap, entry_barrier=False, sync=False, **args), heap, iters, warmup)
    prog(heap, **args)
    return secs


def _flops(prog_dims: dict, flops_expr: str | None) -> float:
    if flops_expr:
        return float(eval(flops_expr, {}, dict(prog_dims)))  # noqa: S307 - a formula of the user's dims
    return 2.0 * prog_dims["M"] * prog_dims["N"] * prog_dims["K"]


def _inputs(prog, heap, seed: int):
    """Every tensor of a call, on the heap: random inputs (a flash-decode program gets the decode bench's Q, K,
    V and full lengths: random integers would be meaningless lengths), zeroed outputs."""
    from tilec.bench_decode import DECODE_DIMS, kv_layout, make_inputs
    from tilec.reference import TORCH_DTYPE

    sig = prog.signature()
    decode = {}
    if all(d in prog.dims for d in DECODE_DIMS) and {"Q", "K", "V", "lens"} <= set(sig):
        try:
            layout = kv_layout(sig["K"][2], prog.dims)
        except TilecError:  # not the decode bench's tensors after all: random inputs like any program
            layout = None
        if layout:
            q, k, v, lens = make_inputs(prog.dims, prog.world, heap.rank, sig["Q"][1], heap.device, seed, layout)
            decode = {"Q": q, "K": k, "V": v, "lens": lens}
    args = {}
    rand = random_inputs(prog, heap.rank, seed, skip=tuple(decode))
    for name, (kind, dtype, shape, _sym) in sig.items():
        t = heap.alloc(shape, TORCH_DTYPE[dtype], zero=kind != "in")
        if name in decode:
            t.copy_(decode[name])
        elif kind == "in":
            t.copy_(rand[name])
        args[name] = t
    return args


def random_inputs(prog, rank: int, seed: int, skip: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """The random inputs `_inputs` gives rank `rank` (CPU tensors, names in `skip` left out): every rank can
    rebuild every other's, which is what the reference of a timed call needs."""
    from tilec.reference import TORCH_DTYPE

    g = torch.Generator(device="cpu").manual_seed(seed + rank)
    return {name: (torch.randn(shape, generator=g) / 8).to(TORCH_DTYPE[dtype])
            for name, (kind, dtype, shape, _sym) in prog.signature().items() if kind == "in" and name not in skip}


def reference_outputs(prog, rank: int, seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Rank `rank`'s outputs of `prog` on the inputs `_inputs(seed)` gives every rank, by the reference
    interpreter (torch, f32 accumulation)."""
    from tilec.reference import evaluate

    ref = evaluate(prog.program, [random_inputs(prog, r, seed) for r in range(prog.world)], device)[rank]
    return {n: ref[n] for n, (kind, *_r) in prog.signature().items() if kind == "out"}


def _output_error(heap, args: dict, ref: dict) -> float:
    """The largest relative error of this rank's outputs in `args` against `ref`, once every rank's last call is
    done (peers may push into this rank's outputs: a barrier, which also waits for this rank's GPU)."""
    from tilec.run import output_error

    heap.barrier()
    return max((output_error(args[n], want)[1] for n, want in ref.items()), default=0.0)


def wrong_rows(rows: list[dict], dtype: str) -> list[dict]:
    """tilec rows whose output error is above the bench's tolerance for `dtype` (a wrong result, not a time)."""
    from tilec.bench_decode import TOLERANCE

    tol = TOLERANCE.get(dtype, 1e-2)
    return [r for r in rows if r.get("kind") == "tilec" and r.get("rel_err") is not None and r["rel_err"] > tol]


def bench_rank(heap, path: str, shapes: list[tuple[int, int, int]], world: int, schedules: list[str],
               dtype: str, iters: int, tune: bool, log) -> list[dict]:
    """Runs on every rank; returns rows (rank 0's are the ones reported)."""
    import tilec
    from tilec.bench_baselines import baselines, gemm_pattern

    rows: list[Row] = []
    cache = load_tuned()
    found: dict = {}  # configs tuned by this run, merged into the cache at the end
    device = _device_name(heap)
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
        ref = None  # this rank's reference outputs of the shape (the same for every schedule and config)
        mark = heap.mark()
        base = baselines(heap, dims, world, dtype, iters, _median_time, pattern)
        for name, secs, note in base:
            shape_rows.append(Row(Path(path).stem, dims, world, dtype, name, "baseline", secs * 1e6,
                                  flops / secs / 1e12, note=note))
        step += 1
        log(f"[{step}/{total}] {dims} baselines: " + ", ".join(f"{r.name} {r.median_us:.0f}us" for r in shape_rows))
        for s in schedules:
            step += 1
            key = f"{src_hash}|{s}|{m}x{n}x{k}|w{world}|{dtype}|{device}"
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
                args = _inputs(prog, heap, 0)
                try:
                    secs = _median_time(lambda p=prog, a=args: p(heap, entry_barrier=False, sync=False, **a), heap,
                                        iters if len(cands) == 1 else max(3, iters // 3), 2)
                except Exception as e:  # a config that does not compile (shared memory) is skipped
                    log(f"    {s} {cfg}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    heap.release(inner)
                    continue
                if ref is None:
                    ref = reference_outputs(prog, heap.rank, 0, "cpu" if heap.interpret else str(heap.device))
                err = _output_error(heap, args, ref)
                if len(cands) > 1:
                    log(f"    tune {s} {cfg}: {secs * 1e6:.0f}us")
                if best is None or best[0] == "skip" or secs < best[1]:
                    best = (cfg, secs, prog, args, err)
                heap.release(inner)
            if best is None or best[0] == "skip":
                log(f"[{step}/{total}] {dims} {s}: skipped ({best[1] if best else 'no config ran'})")
                continue
            cfg, secs, err = best[0], best[1], best[4]
            per_sm = best[2].programs_per_sm(heap)
            cache[key] = found[key] = list(cfg)
            if len(cands) > 1:  # re-time the winner with the full iteration count
                prog = tilec.compile(path, world=world, schedule=s, retype=retype, group_m=cfg[5],
                                     num_warps=cfg[3], num_stages=cfg[4],
                                     dims={**dims, "BM": cfg[0], "BN": cfg[1], "BK": cfg[2]})
                inner = heap.mark()
                args = _inputs(prog, heap, 0)
                secs = _median_time(lambda p=prog, a=args: p(heap, entry_barrier=False, sync=False, **a), heap,
                                    iters, 2)
                err = max(err, _output_error(heap, args, ref))
                heap.release(inner)
            conf = dict(zip(("BM", "BN", "BK", "num_warps", "num_stages", "group_m"), cfg, strict=True))
            conf["programs_per_sm"] = per_sm  # of the persistent kernels (occupancy, LaunchContext.fit)
            if heap.rank == 0:  # `--schedule auto` prefers measured times of this program, shape, world and GPU
                from tilec.auto import key as auto_key
                from tilec.auto import record_measured

                record_measured(auto_key(Path(path).read_text(), world, dims, device), s, secs * 1e6)
            row = Row(Path(path).stem, dims, world, dtype, s, "tilec", secs * 1e6, flops / secs / 1e12, conf,
                      rel_err=float(f"{err:.3g}"))
            wrong = wrong_rows([asdict(row)], dtype)
            if wrong:
                row.note = f"WRONG: relative error {err:.3g} of its outputs"
            shape_rows.append(row)
            log(f"[{step}/{total}] {dims} {s}: {secs * 1e6:.0f}us {flops / secs / 1e12:.0f} TFLOP/s {conf}"
                + (f"  {row.note}" if wrong else ""))
        heap.release(mark)
        best_base = min((r.median_us for r in shape_rows if r.kind == "baseline"), default=None)
        for r in shape_rows:
            if best_base:
                r.ratio_to_best_baseline = round(best_base / r.median_us, 4)
        rows += shape_rows
    if heap.rank == 0:
        store_tuned(found)
    return [asdict(r) for r in rows]


def save_results(rows: list[dict], out_dir: Path, tag: str, meta: dict) -> tuple[Path, Path | None]:
    from tilec.fileio import ensure_dir, output_path, write_atomic

    ensure_dir(out_dir)
    js, png = out_dir / f"{tag}.json", out_dir / f"{tag}.png"
    output_path(png)  # both outputs are checked before either is written
    write_atomic(js, json.dumps({"meta": meta, "rows": rows}, indent=1))
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
    write_atomic(png, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))
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
        from tilec.bench_decode import DECODE_SHAPES

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
        from tilec.bench_decode import prepare

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
    meta = {"program": path, "world": world, "gpu": _gpu_name(), "dtype": dtype, "shapes": shapes,
            "torch": torch.__version__, "backend": backend, "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "ranks_share_gpu": bool(torch.cuda.is_available() and world > torch.cuda.device_count()),
            "timing": "median of CUDA-event times per call; cross-rank barrier before each call, outside the timer"}
    if family == "decode":
        from tilec.bench_decode import COPY_GBPS, MAX_SPLITS

        meta.update({"family": "decode", "metric": "gbps", "copy_gbps": COPY_GBPS, "max_splits": MAX_SPLITS,
                     "run_copy_gbps": "per row: a device copy of the shape's K timed in the same run (read + write"
                                      " bytes per second, as `tilec calibrate` counts them; a kernel time like"
                                      " local_us); None on the CPU",
                     "local_us": "per bsp row: its local phase alone (split + merge kernels), a kernel time:"
                                 " median of CUDA-event times of launches each after an L2 flush that reads a buffer"
                                 " of several L2s (tilec.gpu_time.cold_time), as the run copy is timed",
                     "lens": "full: lens[b] = W * S", "tune": tune, "skipped": skipped,
                     "kv_bytes": "2 * B * S * HKV * D * element size, per rank per call",
                     "rel_err": "max |O - O_ref| / max |O_ref|; O_ref: the first baseline's output, else the whole"
                                " op in f32 (small shapes)"})
    tag = f"{Path(path).stem}_{shapes.replace(',', '+')}_{dtype}"
    out = Path(out_dir or f"benchmarks/results/{machine_tag(world)}")
    js, png = save_results(rows, out, tag, meta)
    _log(f"wrote {js}" + (f" and {png}" if png else ""))
    if family == "decode":
        from tilec.bench_decode import table

        table(rows, skipped)
    else:
        _table(rows)
    return rows


def _bench_family(family, heap, path, shape_list, world, schedules, dtype, iters, tune, log):
    if family == "decode":
        from tilec.bench_decode import bench_rank as decode_bench_rank

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
