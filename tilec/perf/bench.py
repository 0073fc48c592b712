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
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from tilec import settings
from tilec.errors import ScheduleError, TilecError
from tilec.passes.schedules import SCHEDULES
from tilec.perf.inputs import bench_inputs, gemm_inputs, gemm_reference
from tilec.perf.measure import (
    Timing,
    device_key,
    gpu_name,
    kernel_backend,
    load_tuned,
    progress,
    store_tuned,
    time_op,
    time_program,
)
from tilec.perf.rows import TimedRow, finish_shape, rel_err, rounds_text, second_round, table_text
from tilec.runtime import under_torchrun

SHAPES = {
    "paper": [(1024, 3584, 8192), (8192, 4608, 36864), (8192, 3584, 14336), (8192, 11008, 4096),
              (8192, 28672, 8192)],
    "square": [(8192, 8192, 8192)],
    "scale": [(8192, 4608, 36864)],  # the shape of docs/SCALE.md's predictions
    "decode": [(1, 8192, 8192), (16, 8192, 8192), (64, 8192, 8192), (256, 8192, 8192)],
    "small": [(256, 256, 256), (512, 384, 256)],
}
# (BM, BN, BK, num_warps, num_stages, group_m): Hopper-friendly configs for pointer-based tl.dot GEMMs
CONFIGS = [
    (128, 256, 64, 8, 3, 8),
    (128, 256, 64, 8, 4, 8),
    (256, 128, 64, 8, 3, 8),
    (128, 128, 64, 8, 4, 8),  # twice the tiles: fills the SMs where 128x256 tiles leave a short last wave
    (128, 128, 64, 4, 4, 8),
    (128, 128, 128, 8, 3, 8),
]
SMALL_M_CONFIGS = [(64, 128, 64, 4, 4, 8), (64, 256, 64, 8, 3, 8)]  # M <= 64: shorter tiles waste fewer rows
# where the default 128x256 tiles leave SMs idle (fewer tiles than SMs), shorter tiles fill them
FEW_TILES_CONFIGS = [(64, 256, 64, 8, 4, 8), (64, 256, 64, 4, 4, 8), (64, 256, 128, 8, 3, 8)]


def gemm_configs(m: int, n: int, sms: int) -> list[tuple]:
    """The tile configs `tilec bench` tunes over for an M x N output on a GPU of `sms` SMs (first: the default)."""
    if m <= 64:
        return SMALL_M_CONFIGS
    tiles = -(-m // 128) * -(-n // 256)
    return CONFIGS + FEW_TILES_CONFIGS if tiles < sms else CONFIGS
CPU_CONFIGS = [(64, 64, 32, 4, 1, 8)]


@dataclass
class Row(TimedRow):
    tflops: float  # of the device time
    peak_mem_bytes: int | None = None  # allocator peak of one call beyond what was allocated before it
    heap_bytes: int | None = None  # symmetric heap bytes the tilec program uses (its tensors and buffers)
    config: dict = field(default_factory=dict)
    rel_err: float | None = None  # max |C - C_ref| / max |C_ref|; C_ref: torch in f32, else the first baseline
    best_baseline: str | None = None
    ratio_to_best_baseline: float | None = None  # best baseline's device time / this row's (> 1: faster)
    floor_us: float | None = None  # cuBLAS alone on the whole problem, on one GPU
    frac_of_floor: float | None = None  # floor / this row's device time
    note: str = ""
    rounds_us: list | None = None  # the median device time of each timing round (the row reports the faster)


def measured_tiles(program: str, world: int, dims: dict[str, int], launch: dict) -> tuple[dict, dict, str]:
    """(dims, launch, what was chosen) of the kernels `tilec taxes --measure / --timeline` times on a GPU: the tiles
    and launch options given (-D BM=.., --num-warps ..) win; for a GEMM program (dims M, N, K) without them, the
    config `tilec bench` tuned for this shape and world on this GPU (bsp's), else its first config for the shape
    (Hopper tiles: 128x256x64, 8 warps), not the program's default tiles."""
    from tilec.frontend.parser import parse_file

    given = {k for k in ("BM", "BN", "BK") if k in dims}
    try:
        family = program_family(program)
    except TilecError:
        family = ""
    if given or family != "gemm" or not torch.cuda.is_available():
        return dims, launch, ""
    ast = parse_file(program)
    full = {d.name: d.default for d in ast.dims if d.default is not None} | dict(dims)
    m, n, k = full["M"], full["N"], full["K"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    src = hashlib.sha256(Path(program).read_bytes()).hexdigest()[:12]
    device = torch.cuda.get_device_name(0)
    tuned = load_tuned()
    cfg, how = None, ""
    for key, val in tuned.items():
        parts = key.split("|")
        if len(parts) == 6 and parts[0] == src and parts[1] == "bsp" and parts[2] == f"{m}x{n}x{k}" \
                and parts[3] == f"w{world}" and parts[5] == device:
            cfg, how = tuple(val), "tuned by tilec bench (bsp's)"
            break
    if cfg is None:
        cfg, how = gemm_configs(m, n, sms)[0], "tilec bench's first config for this shape (not tuned here)"
    bm, bn, bk, nw, ns, gm = cfg
    chosen = {"num_warps": nw, "num_stages": ns, "group_m": gm}
    launch = {**launch, **{k: v for k, v in chosen.items() if launch.get(k) is None}}  # --num-warps .. still win
    text = (f"measured tiles BM={bm} BN={bn} BK={bk}, {launch['num_warps']} warps, {launch['num_stages']} stages, "
            f"group_m {launch['group_m']}: {how}; -D BM=.. to override")
    return dims | {"BM": bm, "BN": bn, "BK": bk}, launch, text


def timed_row(program: str, dims: dict, world: int, dtype: str, name: str, kind: str, t: Timing, flops: float,
              **kw) -> Row:
    return Row(program, dims, world, dtype, name, kind, round(t.device_us, 3), round(t.p10_us, 3),
               round(t.p90_us, 3), round(t.min_us, 3), round(t.max_us, 3), t.iters, t.how,
               round(t.host_us, 3) if t.host_us is not None else None, float(f"{flops / t.device_us / 1e6:.4g}"),
               peak_mem_bytes=t.peak_bytes, **kw)


def wrong_rows(rows: list[dict], dtype: str) -> list[dict]:
    """tilec rows whose output error is above the bench's tolerance for `dtype` (a wrong result, not a time)."""
    from tilec.perf.bench_decode import TOLERANCE

    tol = TOLERANCE.get(dtype, 1e-2)
    return [r for r in rows if r.get("kind") == "tilec" and r.get("rel_err") is not None and r["rel_err"] > tol]


def _flops(prog_dims: dict, flops_expr: str | None) -> float:
    if flops_expr:
        return float(eval(flops_expr, {}, dict(prog_dims)))  # noqa: S307 - a formula of the user's dims
    return 2.0 * prog_dims["M"] * prog_dims["N"] * prog_dims["K"]


def bench_rank(heap, path: str, shapes: list[tuple[int, int, int]], world: int, schedules: list[str],
               dtype: str, iters: int, tune: bool, log, ranks_per_node: int | None = None,
               options: dict | None = None) -> list[dict]:
    """Runs on every rank; returns rows (rank 0's are the ones reported). Per shape: the floor, the baselines and
    every schedule, all on the same inputs, each timed by measure.time_op (device time of CUDA graph replays where
    the op can be captured, host time of one eager call) and its output checked."""
    from tilec.perf.auto import backend_suffix, compile_variant, options_suffix
    from tilec.perf.bench_baselines import first_baseline, gemm_floor, gemm_ops, gemm_pattern, time_ops

    rows: list[Row] = []
    cache = load_tuned()
    found: dict = {}  # configs tuned by this run, merged into the cache at the end
    device = device_key(heap)
    # backend nvshmem on its heap (or with ranks_per_node), and the compile options given
    kernels = kernel_backend(heap.backend, ranks_per_node, options)
    built = options_suffix(settings.built_with(kernels))  # tuned configs kept apart per build
    src_hash = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12] + built + backend_suffix(kernels, world)
    all_configs = CPU_CONFIGS if heap.interpret else CONFIGS
    sms = 0 if heap.interpret else torch.cuda.get_device_properties(heap.device).multi_processor_count
    retype = {"f16": dtype} if dtype != "f16" else None
    stem = Path(path).stem
    bar = progress(len(shapes) * (len(schedules) + 1), "bench", log if heap.rank == 0 else None)
    picks = auto_picks(path, shapes, world, device, kernels) if "auto" in schedules else {}
    for (m, n, k) in shapes:
        dims = {"M": m, "N": n, "K": k}
        pattern = gemm_pattern(path, world, dims)
        flops = _flops(dims, None) / (world if pattern != "ag" else 1)  # rs/ar: each rank multiplies a K-shard
        shape_rows: list[Row] = []
        ref = None  # this rank's reference outputs of the shape (the same for every schedule and config)
        mark = heap.mark()
        a, b = gemm_inputs(pattern, dims, world, heap.rank, dtype, heap.device)
        ref = gemm_reference(pattern, dims, world, heap.rank, dtype, heap.device)
        floor_in = (torch.randn(m, k, device=heap.device).to(a.dtype),
                    torch.randn(k, n, device=heap.device).to(b.dtype))
        fl = gemm_floor(*floor_in)
        t = time_op(fl.fn, heap, iters, 3)
        shape_rows.append(timed_row(stem, dims, world, dtype, fl.name, fl.kind, t, _flops(dims, None), note=fl.note))
        retime = [(shape_rows[-1], lambda fl=fl: time_op(fl.fn, heap, iters, 3))]  # (row, its second timing)
        timed = time_ops(gemm_ops(heap, world, pattern, a, b, log), heap, iters, log)
        ref = ref if ref is not None else first_baseline(timed)
        for op, t, out in timed:
            shape_rows.append(timed_row(stem, dims, world, dtype, op.name, op.kind, t, flops, rel_err=rel_err(out, ref),
                                        note=op.note))
            retime.append((shape_rows[-1], lambda op=op: time_op(op.fn, heap, iters, 3)))
        bar.step(f"{dims} baselines: " + ", ".join(f"{r.name} {r.device_us:.0f}us" for r in shape_rows))
        for name in schedules:
            s = picks[(m, n, k)] if name == "auto" else name  # the auto row times the variant auto picks
            key = f"{src_hash}|{s}|{m}x{n}x{k}|w{world}|{dtype}|{device}"
            configs = all_configs if heap.interpret else gemm_configs(m, n, sms)
            cands = [tuple(cache[key])] if key in cache else (configs if tune else configs[:1])
            best, why = None, "no config ran"
            for cfg in cands:
                bm, bn, bk, nw, ns, gm = cfg
                try:
                    prog = compile_variant(path, world, s, {**dims, "BM": bm, "BN": bn, "BK": bk}, retype=retype,
                                           group_m=gm, num_warps=nw, num_stages=ns, **kernels)  # e.g. flags+dma
                except ScheduleError as e:
                    why = str(e)
                    break
                if len(cands) == 1:
                    best = (cfg, prog)
                    break
                inner = heap.mark()
                args = bench_inputs(prog, heap, 0)
                try:
                    # device time, as the final row is timed: events around eager calls would rank small shapes
                    # by their host launch time (a 1024x3584x8192 GEMM picked a config 9% slower on the H200)
                    secs = time_program(prog, heap, args, max(5, iters // 3), 2, host_iters=1).device_us / 1e6
                except Exception as e:  # a config that does not compile (shared memory) is skipped
                    log(f"    {s} {cfg}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    continue
                finally:
                    heap.release(inner)
                log(f"    tune {s} {cfg}: {secs * 1e6:.0f}us")
                if best is None or secs < best[2]:
                    best = (cfg, prog, secs)
            if best is None:
                bar.step(f"{dims} {s}: skipped ({why})")
                continue
            cfg, prog = best[0], best[1]
            try:
                r = _time_tilec(prog, heap, iters, {"A": a, "B": b}, ref, flops, stem, dims, world, dtype, name)
            except Exception as e:  # noqa: BLE001 - e.g. a wait that timed out: said, the other rows still run
                bar.step(f"{dims} {s}: failed ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
                continue
            cache[key] = found[key] = list(cfg)
            r.config = dict(zip(("BM", "BN", "BK", "num_warps", "num_stages", "group_m"), cfg, strict=True))
            r.config["programs_per_sm"] = prog.programs_per_sm(heap)  # of the persistent kernels (occupancy)
            if name == "auto":
                r.note = f"auto picked {s}"
            if heap.rank == 0:  # `--schedule auto` prefers device times of this program, shape, world and device
                # (recorded under the variant's name: "flags", "flags+dma")
                from tilec.perf.auto import key as auto_key
                from tilec.perf.auto import record_measured

                record_measured(auto_key(Path(path).read_text(), world, dims, device, kernels=kernels), s,
                                r.device_us)
            shape_rows.append(r)
            retime.append((r, lambda prog=prog, a=a, b=b: _tilec_timing(prog, heap, iters, {"A": a, "B": b}, 1)[0]))
            bar.step(f"{dims} {s}: {r.device_us:.0f}us device, {r.host_us:.0f}us host, {r.tflops:.0f} TFLOP/s"
                     f"{_wrong(r, dtype)}")
        if not heap.interpret:  # the CPU emulation's wall-clock rows are not compared: one round
            second_round(retime, lambda r, t, dims=dims, flops=flops: timed_row(
                stem, dims, world, dtype, r.name, r.kind, t, _flops(dims, None) if r.kind == "floor" else flops),
                ("tflops",))
            log(f"    {dims} second round (reverse order; each row keeps its faster): {rounds_text(shape_rows)}")
        del floor_in, fl, retime
        heap.release(mark)
        finish_shape(shape_rows)
        rows += shape_rows
        if not heap.interpret:
            torch.cuda.empty_cache()
    bar.close()
    if heap.rank == 0:
        store_tuned(found)
    return [asdict(r) for r in rows]


TOLERANCE = {"f16": 2e-2, "bf16": 5e-2, "f32": 1e-4}


def _wrong(r, dtype: str) -> str:
    return f"  WRONG RESULT: relative error {r.rel_err:.2e}" if r.rel_err is not None and \
        r.rel_err > TOLERANCE.get(dtype, 5e-2) else ""


def auto_picks(path: str, shapes, world: int, device: str, kernels: dict | None = None) -> dict[tuple, str]:
    """(M, N, K) -> the variant `--schedule auto` picks (schedule, "+dma" for the copy engines), for every shape
    before any is timed: every rank then reads the same auto cache (rank 0 records times as it goes)."""
    from tilec.perf.auto import candidates

    src = Path(path).read_text()
    out = {}
    for m, n, k in shapes:
        dims = {"M": m, "N": n, "K": k}
        out[(m, n, k)] = candidates(path, src, world, dims, dims, device=device, kernels=kernels)[0]["schedule"]
    return out


def _time_tilec(prog, heap, iters: int, inputs: dict, ref, flops: float, stem, dims, world, dtype, name) -> Row:
    """One schedule's row: its tensors on the heap (inputs copied in), device time of CUDA graph replays where
    the schedule can be captured (else events around the call), host time of one eager call, output checked."""
    t, out, heap_bytes = _tilec_timing(prog, heap, iters, inputs)
    return timed_row(stem, dims, world, dtype, name, "tilec", t, flops, heap_bytes=heap_bytes,
                     rel_err=rel_err(out, ref))


def _tilec_timing(prog, heap, iters: int, inputs: dict, host_iters: int = 5):
    """(Timing, C, heap bytes) of one schedule on fresh heap tensors holding `inputs`."""
    inner = heap.mark()
    used = heap.used
    try:
        args = bench_inputs(prog, heap, 0)
        for nm, x in inputs.items():
            args[nm].copy_(x)
        t = time_program(prog, heap, args, iters, host_iters=host_iters)
        return t, args["C"].clone(), heap.used - used  # the call's tensors and the program's buffers
    finally:
        heap.release(inner)


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
    def shape_of(r):
        return r.get("label") or "x".join(str(v) for v in r["shape"].values())

    # device time per row on a log axis (shapes differ by 100x), p10-p90 as error bars, the floor as a line
    shapes = list(dict.fromkeys(shape_of(r) for r in rows))
    names = list(dict.fromkeys(r["name"] for r in rows if r["kind"] != "floor"))
    fig, ax = plt.subplots(figsize=(max(7, 1.8 * len(shapes)), 4.5))
    w = 0.8 / max(1, len(names))
    for i, nm in enumerate(names):
        xs, ys, lo, hi = [], [], [], []
        for j, s in enumerate(shapes):
            v = [r for r in rows if r["name"] == nm and shape_of(r) == s]
            if v:
                xs.append(j + i * w)
                ys.append(v[0]["device_us"])
                lo.append(v[0]["device_us"] - v[0]["p10_us"])
                hi.append(v[0]["p90_us"] - v[0]["device_us"])
        hatch = "//" if any(r["name"] == nm and r["kind"] == "reference" for r in rows) else None
        ax.bar(xs, ys, w, yerr=[lo, hi], label=nm, hatch=hatch, capsize=1.5, error_kw={"linewidth": 0.6})
    for j, s in enumerate(shapes):
        fl = [r["floor_us"] for r in rows if shape_of(r) == s and r.get("floor_us")]
        if fl:
            ax.plot([j - w / 2, j + 0.8 - w / 2], [fl[0], fl[0]], color="black", linestyle="--", linewidth=1,
                    label="floor" if j == 0 else None)
    ax.set_yscale("log")
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(shapes))], shapes, rotation=15, fontsize=8)
    ax.set_ylabel("device time per call (us, log)")
    ax.set_title(f"{tag} ({meta.get('gpu', '')}, world {meta.get('world')}; {meta.get('floor', 'floor')})",
                 fontsize=8)
    ax.legend(fontsize=6, ncol=2)
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
        from tilec.perf.bench_decode import DECODE_SHAPES

        return DECODE_SHAPES
    return SHAPES


def machine_tag(world: int) -> str:
    from tilec.perf.measure import gpu_sharing

    if not torch.cuda.is_available():
        return "cpu"
    name = torch.cuda.get_device_name().lower()
    gpu = "h200" if "h200" in name else "h100" if "h100" in name else name.split()[-1]
    sharing = gpu_sharing(world)
    if sharing:  # ranks on fewer GPUs than ranks: h200-1gpu-mps (side by side) or h200-1gpu-time-sliced
        return f"{gpu}-{torch.cuda.device_count()}gpu-{sharing}"
    return f"{gpu}-{world}gpu" if world == 1 else f"{gpu}-x{world}"


def label_shared_rows(rows: list[dict], world: int, meta: dict) -> None:
    """Where ranks share a GPU, say how in the run's meta and on every row (an MPS row is not an NVLink row)."""
    from tilec.perf.measure import SHARING_LABEL, gpu_sharing, sharing_note

    how = gpu_sharing(world)
    meta["gpu_sharing"] = how or "one GPU per rank"
    if not how:
        return
    meta["gpu_sharing_note"] = sharing_note(world, how)
    for r in rows:
        r["note"] = f"{r['note']}; {SHARING_LABEL[how]}" if r.get("note") else SHARING_LABEL[how]


def run_bench(path: str, world: int, shapes: str, schedules: list[str] | None, dtype: str, iters: int,
              tune: bool | None, out_dir: str | None, backend: str | None,
              ranks_per_node: int | None = None, options: dict | None = None) -> list[dict]:
    """Times every schedule of `path` beside the baselines on the named shape sets (comma separated) and writes
    JSON + a plot. The family (GEMM or decode) and so the valid shape sets follow from the program's dims.
    tune: time several tile configs (cached); None: the family's default (GEMM: tune, decode: don't).
    backend: a heap, or several comma separated ("iris,nvshmem": the ranks are started once per backend, every
    schedule timed on each, the rows side by side); ranks_per_node: compile backend nvshmem's kernels for nodes of
    that many (on an NVSHMEM heap, or on the CPU emulation's); options: tilec.compile options of every program
    timed (settings.OPTIONS, e.g. {"fold": False}), recorded in the JSON's meta and in the measured times' keys."""
    from tilec.runtime import default_backend, spawn

    backends = backend_list(backend or default_backend(), under_torchrun())
    backend = backends[0]
    if ranks_per_node is not None and (ranks_per_node < 1 or world % ranks_per_node):
        raise TilecError(f"--ranks-per-node {ranks_per_node}: must divide the world ({world})")
    if ranks_per_node is not None and ranks_per_node < world and "iris" in backends:
        raise TilecError(f"--ranks-per-node {ranks_per_node} with --backend {','.join(backends)}: an Iris heap reaches "
                         "every peer by pointer, on one node; several nodes need backend nvshmem (or cpu)")
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

        heap_bytes = prepare(path, shape_list, world, dtype, backend == "cpu",
                             settings.given_options(options).get("programs_per_sm"))
    else:
        heap_bytes = _heap_bytes(shape_list, world, dtype)
    log = _log
    if under_torchrun():  # this process is one rank
        from tilec.runtime import from_env

        heap = from_env(backend, heap_bytes)
        world = heap.world
        result = _bench_family(family, heap, path, shape_list, world, schedules, dtype, iters, tune,
                               log if heap.rank == 0 else lambda *_: None, ranks_per_node, options)
        if heap.rank != 0:
            return result["rows"] if family == "decode" else result
        per_backend = {backend: result}
    else:
        per_backend = {}
        for be in backends:
            if len(backends) > 1:
                log(f"tilec bench: backend {be} ({backends.index(be) + 1} of {len(backends)})")
            results = spawn(_bench_spawned, world, backend=be, heap_bytes=heap_bytes, timeout=3600,
                            args=(path, shape_list, world, schedules, dtype, iters, tune, family, ranks_per_node,
                                  options))
            per_backend[be] = results[0]
    rows = side_by_side({be: r["rows"] if family == "decode" else r for be, r in per_backend.items()}, ranks_per_node)
    skipped = per_backend[backend]["skipped"] if family == "decode" else None
    meta = {"program": path, "world": world, "gpu": gpu_name(), "dtype": dtype, "shapes": shapes,
            "torch": torch.__version__, "backend": ",".join(per_backend), "date": time.strftime("%Y-%m-%d %H:%M:%S"),
            "ranks_share_gpu": bool(torch.cuda.is_available() and world > torch.cuda.device_count()),
            "timing": "device_us: median (p10/p90/min/max beside) over `iters` runs of each row's `timing`: CUDA "
                      "graph replays where the op can be captured (every baseline, tilec schedules without a host "
                      "barrier), else CUDA events around an eager call; an L2 flush that reads and a cross-rank "
                      "barrier before each run, outside the events; warm-up excluded. host_us: one eager Python "
                      "call until its device work is done (median of 5). Ratios: device time against device time",
            "rounds_us": "per row on a GPU: the median of each of two timing rounds, the second in reverse order;"
                         " device_us and its spread are the faster round's (what ran just before a timing can slow"
                         " it: tilec.perf.rows.second_round)",
            "memory": "peak_mem_bytes: the allocator's peak during one call beyond what was allocated before it; "
                      "heap_bytes: the symmetric heap the tilec program's tensors and buffers take",
            "floor": "cuBLAS alone on the whole problem on one GPU" if family == "gemm" else
                     "KV bytes per rank / the copy bandwidth measured in the run (+ one NVLink round trip, world > 1)",
            "iters": iters}
    if settings.given_options(options):  # what every tilec row was compiled with, beyond the defaults
        meta["options"] = settings.built_with(options).line().removeprefix("settings: ")
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
                     "rel_err": "max |O - O_ref| / max |O_ref|; O_ref: the whole op in f32 recomputed from every"
                                " rank's inputs where the cache is small, else the first baseline's output"})
    label_shared_rows(rows, world, meta)
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


def _bench_family(family, heap, path, shape_list, world, schedules, dtype, iters, tune, log, ranks_per_node=None,
                  options=None):
    if family == "decode":
        from tilec.perf.bench_decode import bench_rank as decode_bench_rank

        return decode_bench_rank(heap, path, shape_list, world, schedules, dtype, iters, tune, log, ranks_per_node,
                                 options)
    return bench_rank(heap, path, shape_list, world, schedules, dtype, iters, tune, log, ranks_per_node, options)


def _bench_spawned(heap, path, shape_list, world, schedules, dtype, iters, tune, family="gemm", ranks_per_node=None,
                   options=None):
    return _bench_family(family, heap, path, shape_list, world, schedules, dtype, iters, tune,
                         _log if heap.rank == 0 else (lambda *_: None), ranks_per_node, options)


def backend_list(text: str, torchrun: bool) -> list[str]:
    """`--backend iris,nvshmem` -> ["iris", "nvshmem"]; a TilecError naming the argument for an unknown or repeated
    backend, or several under torchrun (its processes hold one heap: launch once per backend)."""
    from tilec.runtime.launcher import BACKENDS

    names = [b.strip() for b in text.split(",")]
    bad = [b for b in names if b not in BACKENDS]
    if bad or len(set(names)) != len(names):
        raise TilecError(f"--backend {text}: choose one or more of {', '.join(BACKENDS)}, comma separated, each once")
    if torchrun and len(names) > 1:
        raise TilecError(f"--backend {text}: under torchrun each rank holds one heap; launch once per backend, or run"
                         " without torchrun (tilec bench then starts the ranks once per backend)")
    return names


def not_run(schedules, rows: list[dict]) -> list[str]:
    """The schedules named that no row timed (a row of several backends' run is "flags [nvshmem]")."""
    ran = {r["name"].split(" [")[0] for r in rows if r["kind"] == "tilec"}
    return [s for s in schedules if s not in ran]


def side_by_side(per_backend: dict[str, list[dict]], ranks_per_node: int | None = None) -> list[dict]:
    """The rows of one run per backend as one table: every tilec row says its heap's backend and its kernels' (iris,
    or nvshmem with ranks_per_node: None is one node); with several backends the
    first one's rows keep the baselines (every run times them; one copy is shown) and each tilec row's name says its
    backend ("fused-push [nvshmem]"), shape by shape in the order of the first run."""
    several = len(per_backend) > 1
    out: list[dict] = []
    for i, (be, rows) in enumerate(per_backend.items()):
        for r in rows:
            if r["kind"] != "tilec":
                if i == 0:
                    out.append(r)
                continue
            kernels = kernel_backend(be, ranks_per_node)
            out.append({**r, "backend": be, "kernels": kernels.get("backend", "iris"),
                        "ranks_per_node": kernels.get("ranks_per_node"),
                        "name": f"{r['name']} [{be}]" if several else r["name"]})

    def shape(r):
        return json.dumps(r["shape"], sort_keys=True)

    order = {s: j for j, s in enumerate(dict.fromkeys(shape(r) for r in out))}
    return sorted(out, key=lambda r: order[shape(r)])  # stable: within a shape, the runs' orders


def _heap_bytes(shapes, world, dtype) -> int:
    esz = 4 if dtype == "f32" else 2
    worst = max(2 * m * k + k * n + m * n for m, n, k in shapes) * esz  # A shard, Ag, B, C, with slack
    return int(worst * 1.3) + (64 << 20)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _table(rows: list[dict]) -> None:
    print(table_text(rows))


