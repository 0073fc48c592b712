"""`tilec bench` for flash-decode programs (dims B, HKV, G, D, S; tile BS), e.g. examples/flash_decode.tile.

Same discipline as the GEMM path (tilec.perf.bench): every tilec schedule that applies and the baselines
(tilec.perf.bench_baselines.decode_ops: SDPA with LSE + NCCL, or + torch symmetric memory where the ranks share one
GPU (MPS: NCCL refuses them), plain SDPA at world 1, the naive torch step as a labelled reference) run on the same
Q/K/V/lens, each timed by measure.time_op / time_program: device time of CUDA graph replays where the op can be
captured (else of eager calls), host time of one eager call. Reported per row: device and host time with their
spread, the KV bytes each rank streams (2 * B * S * HKV * D * element size) and the GB/s that makes, its fraction of
the copy bandwidth measured in the same run (a device copy of the shape's K, read + write bytes as `tilec calibrate`
counts them), the floor (KV bytes over that bandwidth, + a measured link round trip at world > 1), the ratio to
tilec's bsp schedule and to the best baseline, and the relative error of the output (a fast wrong kernel shows up).
Lengths are full (lens[b] = W * S). The bsp row also times its local phase alone (the kernels before its first
barrier: split attention and the local merge, `only=`), as a kernel time (kernel_time: launches after a clean L2
flush, like the copy): how fast the local attention streams the KV cache without the exchange, the combine and the
host's launch path. On a GPU every row of a shape is timed twice, the second round in reverse order, and keeps its
faster round (rows.second_round: what ran just before a timing can slow all of its replays).

Tile size BS (positions per split): one default per shape (default_bs: the split whose tasks fill the resident
programs in the fewest waves; attend streams a split in blocks of 64 keys, so a long split costs no registers)
unless --tune, which times default/4 .. default*2 and caches the winner per (program, schedule, shape, world,
dtype, GPU) beside the GEMM tuner's entries. Candidates whose split count S/BS exceeds MAX_SPLITS are not
compiled (see there).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from tilec import settings
from tilec.errors import ScheduleError, TilecError
from tilec.perf.inputs import DECODE_DIMS, kv_layout, kv_room, make_inputs, with_room
from tilec.perf.measure import (
    GRAPH,
    device_key,
    kernel_backend,
    load_tuned,
    median_time,
    progress,
    store_tuned,
    time_op,
    time_program,
)
from tilec.perf.rows import TimedRow, finish_shape, rel_err, rounds_text, second_round, table_text

COPY_GBPS = 4200.0  # measured H200 device-to-device copy bandwidth (docs/GPU.md)
# A split task's fixed cost in keys streamed (default_bs): ~one attend block. Fitted to bsp's local phase at 32K,
# 128 heads on an H200 (benchmarks/results/h200-1gpu/decode_configs/decode_local_probe.log): BS 512 / 1024 / 2048
# took 88.4 / 83.9 / 80.3 us.
TASK_OVERHEAD = 64
# One lse_merge run by the last split of a KV head, in keys a program streams meanwhile (~2 us; default_bs). With more
# split tasks than resident programs fold-last's merges are not shared: the last split of each KV head runs its G
# merges one after another (codegen/flags.Flags.arrive). At B1 H96 S128K three waves of 2048-key splits streamed
# 1.5% faster than one of 8192 alone (decode_configs/decode_split_sweep.log) but the step took 278 us against SDPA's
# 199 (benchmarks/results/h200-1gpu/decode_tail/fd_paper.log).
MERGE_KEYS = 64
# The share of the resident programs that saturates HBM on their own (default_bs): 192 split programs of 2048 keys
# (96 heads at 32K, 0.73 of 264) streamed faster than 264 programs of 512 or 1024 keys, and with 0.75 the model
# ranks first the fastest split of each of the 10 shapes timed on an H200 (8K-1M, 96 and 128 heads:
# benchmarks/results/h200-1gpu/decode_configs/decode_split_sweep.log, decode_stream_probe_first.log;
# tests/test_bench_cpu.py checks).
SATURATING_SHARE = 0.75
MIN_BS = 64
CPU_BS = 32
SPLIT_ALIGN = 64  # a free split's keys are a whole number of attend blocks (default_splits)
# How fast an SM with one split program streams, against one with two (default_splits): 11 splits of 6016 keys a KV
# head (132 tasks, one a SM) against 22 of 3008 (264, two a SM) at 96 heads, 64K keys: 121-122 vs 104 us
# (benchmarks/results/h200-1gpu/decode_splits/ragged_probe*.log).
ONE_PROGRAM_RATE = 0.78
NUM_WARPS, NUM_STAGES = 4, 3
# The example's local merge holds all S/BS partials of one (batch, head) in one program (S/BS x D f32): at 2048
# splits Triton takes ~10 s to compile it for sm_90, at 4096 ~30 s, and 16384 x 128 exceeds Triton's 2^20-element
# tile limit. Candidates beyond this many splits are skipped (with that reason) so a bench run stays bounded;
# TILEC_BENCH_MAX_SPLITS=0 lifts the cap.
MAX_SPLITS = settings.value("TILEC_BENCH_MAX_SPLITS")
WAIT_TIMEOUT_S = 10.0  # a flag wait on a GPU that lasts this long is a hang: fail the candidate, don't stall the run
TOLERANCE = {"f16": 1e-2, "bf16": 5e-2, "f32": 1e-3}  # relative error above which a row is flagged in the log

K_, M_ = 1024, 1024 * 1024


def _paper() -> list[tuple[int, int, int, int, int]]:
    rows = [(1, h // 8, 8, 128, s) for s in (8 * K_, 16 * K_, 32 * K_, 64 * K_, 128 * K_, 256 * K_, M_)
            for h in (96, 128)]
    rows += [(b, 16, 8, 128, s) for b in (8, 32) for s in (16 * K_, 64 * K_)]
    return rows


# (B, HKV, G, D, S): H = HKV * G query heads, GQA G:1, head dim D, S KV positions per rank
DECODE_SHAPES: dict[str, list[tuple[int, int, int, int, int]]] = {
    "decode-paper": _paper(),
    "decode-quick": [(1, 16, 8, 128, 8 * K_), (1, 12, 8, 128, 64 * K_), (1, 16, 8, 128, 128 * K_),
                     (8, 16, 8, 128, 16 * K_)],
    "decode-small": [(1, 2, 4, 32, 64), (2, 1, 8, 32, 96)],
}


@dataclass
class DecodeRow(TimedRow):
    gbps: float  # KV bytes streamed per rank / device time
    frac_of_copy_bw: float  # gbps / the copy bandwidth (measured in the run on a GPU, else COPY_GBPS)
    tflops: float  # 4 * B * H * S * D per rank / device time
    kv_bytes: int
    label: str
    config: dict = field(default_factory=dict)
    peak_mem_bytes: int | None = None  # allocator peak of one call beyond what was allocated before it
    heap_bytes: int | None = None  # symmetric heap bytes the tilec program's tensors and buffers take
    ratio_to_bsp: float | None = None  # bsp device time / this one (> 1: faster than tilec's bsp schedule)
    best_baseline: str | None = None
    ratio_to_best_baseline: float | None = None  # best baseline's device time / this one
    floor_us: float | None = None  # KV bytes / the run's copy bandwidth (+ one link round trip at world > 1)
    frac_of_floor: float | None = None  # floor / device time
    rel_err: float | None = None  # max |O - O_ref| / max |O_ref|; O_ref: the whole op in f32 when small, else
    # the first baseline's output
    note: str = ""
    run_copy_gbps: float | None = None  # a device copy of this shape's K in the same run (GPU only)
    local_us: float | None = None  # bsp: its local phase alone (split + local merge kernels), a kernel time
    local_frac_of_copy_bw: float | None = None  # KV bytes / local_us, over the run's copy bandwidth
    rounds_us: list | None = None  # the median device time of each timing round (the row reports the faster)


def _sig(x: float, digits: int = 5) -> float:
    """x to `digits` significant digits (CPU-emulation rows are millions of times slower: no fixed decimals)."""
    return float(f"{x:.{digits}g}")


def shape_dims(shape: tuple[int, ...]) -> dict[str, int]:
    return dict(zip(DECODE_DIMS, shape, strict=True))


def _si(n: int) -> str:
    for unit, div in (("M", M_), ("K", K_)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def label(dims: dict) -> str:
    return f"B{dims['B']} H{dims['HKV'] * dims['G']} S{_si(dims['S'])}"


def kv_bytes(dims: dict, dtype: str) -> int:
    esz = 4 if dtype == "f32" else 2
    return 2 * dims["B"] * dims["S"] * dims["HKV"] * dims["D"] * esz


def attn_flops(dims: dict) -> float:
    return 4.0 * dims["B"] * dims["HKV"] * dims["G"] * dims["S"] * dims["D"]


def resident_programs(per_sm: int | None = None) -> int:
    """Programs of a persistent decode kernel resident at once: this GPU's SMs (an H200's 132 without one) times
    the per-SM cap (the programs_per_sm option, 2 by default), which the example's kernels fit."""
    from tilec.program import MAX_PROGRAMS_PER_SM

    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    return sms * (per_sm or MAX_PROGRAMS_PER_SM)


def default_bs(dims: dict, interpret: bool, slots: int | None = None) -> int:
    """BS without --tune: the split whose tasks stream the cache in the least time by a wave count. T = B * HKV *
    S/BS split tasks on `slots` resident programs (resident_programs()) run in ceil(T / slots) waves, each as long
    as BS keys plus TASK_OVERHEAD (loading q, finishing and storing the partial). The full waves keep every slot
    busy; the last one's r tasks stream at HBM's rate once they fill SATURATING_SHARE of the slots, so it costs like
    max(r, that share) tasks. More than one wave also costs the G merges of the last split of a KV head, which then
    run one after another (MERGE_KEYS each). Among the powers of two (>= 64, <= S, at most MAX_SPLITS splits) the
    cheapest, the largest of equals (fewer partials to merge). CPU emulation: CPU_BS."""
    if interpret:
        return CPU_BS
    slots = slots or resident_programs()
    saturate = math.ceil(SATURATING_SHARE * slots)
    s, heads = dims["S"], dims["B"] * dims["HKV"]
    best, bs = None, MIN_BS
    while bs <= max(s, MIN_BS):
        if not _too_many_splits(s, {"BS": bs}):
            tasks = heads * -(-s // bs)
            waves = -(-tasks // slots)
            last = tasks - (waves - 1) * slots
            cost = ((waves - 1) * slots + max(last, saturate)) * (bs + TASK_OVERHEAD)
            if waves > 1:  # the merges of a KV head one after another in its last split (MERGE_KEYS)
                cost += slots * dims["G"] * MERGE_KEYS
            if best is None or cost <= best[0]:
                best = (cost, bs)
        bs *= 2
    return best[1] if best else bs // 2


def candidates(dims: dict, interpret: bool, tune: bool, slots: int | None = None) -> list[int]:
    if interpret:
        return [CPU_BS]
    bs = default_bs(dims, interpret, slots)
    if not tune:
        return [bs]
    return [c for c in (bs // 4, bs // 2, bs, bs * 2) if MIN_BS <= c <= dims["S"]]


def free_splits(ast) -> bool:
    """A program whose split count is its own dim: NS splits of L keys (examples/flash_decode_splits.tile), its
    cache block room for NS * L >= S positions and its key tile BS = L rounded up to a power of two."""
    return {"NS", "L"} <= {d.name for d in ast.dims}


def split_of(ns: int, length: int) -> dict:
    return {"NS": ns, "L": length, "BS": 1 << (length - 1).bit_length()}


def default_splits(dims: dict, interpret: bool, slots: int | None = None, sms: int | None = None) -> dict:
    return ranked_splits(dims, interpret, slots, sms)[0]


def ranked_splits(dims: dict, interpret: bool, slots: int | None = None, sms: int | None = None) -> list[dict]:
    """NS and L of a free-split program, cheapest first (default_splits takes the first, --tune the first three):
    the split count whose busiest SM streams the fewest keys.
    T = B * HKV * NS tasks of L = S/NS keys (rounded up to SPLIT_ALIGN) on `sms` SMs of two programs each put
    ceil(T / sms) tasks on the busiest SM, each L + TASK_OVERHEAD keys; an SM with one program streams at
    ONE_PROGRAM_RATE of one with two. At most one wave (T <= slots) unless one split per KV head is already more.
    Measured on an H200 (benchmarks/results/h200-1gpu/decode_splits/ragged_probe*.log): 96 heads at 64K keys, 22 splits
    of 3008 (264 tasks, two on every SM) 104 us, 16 of 4096 (192 tasks, 60 SMs with two) 110-117 us, 11 of 6016 (one a
    SM) 121 us. The CPU emulation: one split more than splits of CPU_BS keys need (L a multiple of 8 below its tile,
    room past S)."""
    s, heads = dims["S"], dims["B"] * dims["HKV"]
    if interpret:  # one split more than CPU_BS keys a split would need: the CPU runs meet padded key tiles
        ns = -(-s // CPU_BS) + 1
        return [split_of(ns, -(-s // (ns * 8)) * 8)]
    slots = slots or resident_programs()
    sms = sms or max(1, slots // 2)
    costed = []
    for ns in range(1, min(MAX_SPLITS or s, -(-s // MIN_BS)) + 1):
        length = -(-s // (ns * SPLIT_ALIGN)) * SPLIT_ALIGN
        tasks = heads * ns
        if (ns - 1) * length >= s or (tasks > slots and ns > 1):
            continue  # an empty split (a smaller NS has the same splits), or a second wave
        costed.append((-(-tasks // sms) * (length + TASK_OVERHEAD) / (1.0 if tasks > sms else ONE_PROGRAM_RATE), ns,
                       length))
    costed.sort()  # equal costs: the fewer splits first
    return [split_of(ns, length) for _c, ns, length in costed] or [split_of(1, s)]


def split_configs(dims: dict, interpret: bool, tune: bool, free: bool, slots: int | None = None) -> list[dict]:
    """The split configs a schedule is timed with: the default, and with --tune its neighbours (BS / 4 .. BS * 2 of
    a power-of-two program; the three cheapest split counts by ranked_splits of a free-split one); slots: resident
    programs (default resident_programs())."""
    if not free:
        return [{"BS": bs} for bs in candidates(dims, interpret, tune, slots)]
    return ranked_splits(dims, interpret, slots)[:3 if tune else 1]


def split_text(cfg: dict) -> str:
    return f"NS={cfg['NS']} L={cfg['L']} BS={cfg['BS']}" if {"NS", "L"} <= set(cfg) else f"BS={cfg['BS']}"


def split_count(s: int, cfg: dict) -> int:
    """Splits of S positions a config makes: NS, or S/BS rounded up."""
    return cfg.get("NS") or -(-s // cfg["BS"])


def _too_many_splits(s: int, cfg: dict) -> str | None:
    splits = split_count(s, cfg)
    if MAX_SPLITS and splits > MAX_SPLITS:
        return (f"{splits} splits > {MAX_SPLITS} (TILEC_BENCH_MAX_SPLITS): the local merge would hold "
                f"{splits} partials per program; not compiled")
    return None


REF_LIMIT = 1 << 30  # bytes of KV over all ranks up to which a rank recomputes the whole op as a reference


def reference_output(dims: dict, world: int, dtype: str, device, seed: int = 0) -> torch.Tensor | None:
    """O of the whole op computed on this rank from every rank's block (regenerated from their seeds), in f32:
    the reference where no distributed baseline runs (ranks sharing a device); None when the cache is too big."""
    from tilec.perf.bench_baselines import local_attention_lse, lse_combine

    if world * kv_bytes(dims, dtype) > REF_LIMIT:
        return None
    os_, ls_ = [], []
    for r in range(world):
        q, k, v, lens = make_inputs(dims, world, r, dtype, device, seed)
        n_local = (lens.to(torch.int64) - r * dims["S"]).clamp(0, dims["S"])
        o, lse = local_attention_lse(q.float(), k.float().transpose(1, 2).contiguous(),
                                     v.float().transpose(1, 2).contiguous(), n_local, dims["G"])
        os_.append(o)
        ls_.append(lse)
    return lse_combine(torch.stack(os_), torch.stack(ls_))


def _args(prog, heap, data: dict) -> dict:
    """The call's tensors: the shared inputs as they are (symmetric ones copied onto the heap), outputs fresh."""
    from tilec.reference import TORCH_DTYPE

    out = {}
    for name, (kind, dtype, shape, sym) in prog.signature().items():
        if kind == "in" and not sym:
            out[name] = data[name]
            continue
        dt = TORCH_DTYPE[dtype]
        t = heap.alloc(shape, dt) if sym else torch.zeros(shape, dtype=dt, device=heap.device)
        if kind == "in":
            t.copy_(data[name])
        out[name] = t
    return out


def check_signature(bound, path: str) -> None:
    """The decode bench feeds Q, K, V, lens and reads O: say so when a program with decode dims differs."""
    d = dict(bound.dims)
    b, h, dd, hkv, s = d["B"], d["HKV"] * d["G"], d["D"], d["HKV"], kv_room(d)  # room: NS * L of a free split
    have = {t.name: (t.kind, tuple(t.shape)) for t in bound.tensors if t.kind != "buf"}
    wants = [{"Q": ("in", (b, h, dd)), "K": ("in", kv), "V": ("in", kv), "lens": ("in", (b,)), "O": ("out", (b, h, dd))}
             for kv in ((b, s, hkv, dd), (b, hkv, s, dd))]
    if have not in wants:
        raise TilecError(f"{path}: the decode bench feeds in Q[B, HKV*G, D], K and V [B, HKV, S, D] or "
                         f"[B, S, HKV, D] (NS*L for S with dims NS and L), lens[B] and reads out O[B, HKV*G, D] "
                         f"(as examples/flash_decode.tile); "
                         f"with dims {d} the program takes "
                         f"{', '.join(f'{n} ({k} {list(sh)})' for n, (k, sh) in have.items())}")


def _declared_shape(path: str, world: int, dims: dict, name: str, cfg: dict) -> tuple[int, ...]:
    from tilec.frontend.parser import parse_file
    from tilec.frontend.sema import check

    return next(tuple(t.shape) for t in check(parse_file(path), world, {**dims, **cfg}).tensors if t.name == name)


def _wrong(r: DecodeRow, tol: float) -> str:
    """A tilec row whose error is above tol gets that as its note; returns what its log line says of it."""
    if r.rel_err is None or r.rel_err <= tol:
        return ""
    r.note = f"relative error {r.rel_err:.3g} above {tol:g}"
    return f"  WRONG: {r.note}"


def bench_rank(heap, path: str, shapes: list[tuple[int, ...]], world: int, schedules: list[str], dtype: str,
               iters: int, tune: bool, log, ranks_per_node: int | None = None, options: dict | None = None) -> dict:
    """Runs on every rank; returns {"rows": [...], "skipped": [...]} (rank 0's are the ones reported). Every row
    (baselines, references, schedules) on the same Q, K, V, lens, timed by measure.time_op: device time of CUDA
    graph replays where the op can be captured, host time of one eager call; outputs checked."""
    import tilec
    from tilec.perf.auto import backend_suffix, options_suffix
    from tilec.perf.bench_baselines import decode_ops, first_baseline, time_ops

    rows: list[DecodeRow] = []
    skipped: list[dict] = []
    cache, found = load_tuned(), {}  # found: this run's choices, merged into the cache (locked) at the end
    device = device_key(heap)  # the CPU interpreter's choices never land under a GPU's name
    # backend nvshmem on its heap (or with ranks_per_node), and the compile options given
    kernels = kernel_backend(heap.backend, ranks_per_node, options)
    built = options_suffix(settings.built_with(kernels))  # tuned configs kept apart per build
    src_hash = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12] + built + backend_suffix(kernels, world)
    retype = {"f16": dtype} if dtype != "f16" else None
    stem = Path(path).stem
    tol = TOLERANCE.get(dtype, 1e-2)
    wait_timeout = 60.0 if heap.interpret else WAIT_TIMEOUT_S
    slots = None if heap.interpret else resident_programs(kernels.get("programs_per_sm"))  # the splits fill these
    per_sm: dict[str, int] = {}  # schedule -> programs per SM of its persistent kernels (LaunchContext.fit)
    bar = progress(len(shapes) * (len(schedules) + 1), "bench", log if heap.rank == 0 else None)
    rtt = link_rtt_us(heap, world, iters)
    rooms: dict[int, dict] = {}  # time_prog: the shape's K and V in blocks with room for NS * L positions

    from tilec.frontend.parser import parse_file

    free = free_splits(parse_file(path))

    def compile_(s, dims, cfg):
        return tilec.compile(path, world=world, schedule=s, retype=retype, num_warps=NUM_WARPS,
                             num_stages=NUM_STAGES, dims={**dims, **cfg}, **{"wait_timeout": wait_timeout, **kernels})

    def time_prog(prog, data, n, final):
        """(Timing, O, bsp's local phase alone in seconds or None, heap bytes); short (no graph, no local phase)
        while tuning, full on the final timing of a schedule."""
        inner = heap.mark()
        used = heap.used
        try:
            room = kv_room(prog.dims)
            if room not in rooms:  # the shape's K and V in blocks with that room, made once per shape
                rooms[room] = {n: with_room(data[n], layout, room) for n in ("K", "V")}
            args = _args(prog, heap, {**data, **rooms[room]})
            t = time_program(prog, heap, args, n, 1, host_iters=5 if final else 1)
            heap_bytes = heap.used - used  # the call's tensors and the program's buffers
            per_sm[prog.schedule] = prog.programs_per_sm(heap)
            out = args["O"].clone()
            local = None
            if final:
                try:  # an extra: a failure is logged, the row stands
                    local = local_phase_time(prog, heap, args, n, median_time)
                    if local is not None:
                        prog(heap, **args)
                except Exception as e:  # noqa: BLE001
                    log(f"    {prog.schedule}: local phase not timed: {type(e).__name__}: {str(e)[:200]}")
            return t, out, local, heap_bytes
        finally:
            heap.release(inner)

    def skip(dims, name, reason):
        skipped.append({"shape": dims, "label": label(dims), "name": name, "reason": reason})
        bar.step(f"{label(dims)} {name}: skipped ({reason})")

    for shape in shapes:
        dims = shape_dims(shape)
        lab = label(dims)
        nbytes, flops = kv_bytes(dims, dtype), attn_flops(dims)
        shape_rows: list[DecodeRow] = []

        mark = heap.mark()
        cfg0 = split_configs(dims, heap.interpret, False, free, slots)[0]
        layout = kv_layout(_declared_shape(path, world, dims, "K", cfg0), {**dims, "S": kv_room({**dims, **cfg0})})
        q, k, v, lens = make_inputs(dims, world, heap.rank, dtype, heap.device, layout=layout)
        data = {"Q": q, "K": k, "V": v, "lens": lens}
        copy = None if heap.interpret else copy_gbps(k, heap, iters)
        bw = copy or COPY_GBPS
        floor_us = nbytes / bw / 1e3 + (rtt or 0.0)

        def row(name, kind, t, config=None, err=None, note="", dims=dims, lab=lab, nbytes=nbytes, flops=flops,
                copy=copy, bw=bw):
            gbps = nbytes / t.device_us / 1e3
            return DecodeRow(stem, dims, world, dtype, name, kind, _sig(t.device_us), _sig(t.p10_us),
                             _sig(t.p90_us), _sig(t.min_us), _sig(t.max_us), t.iters, t.how,
                             _sig(t.host_us) if t.host_us is not None else None, _sig(gbps), _sig(gbps / bw),
                             _sig(flops / t.device_us / 1e6), nbytes, lab, config or {}, peak_mem_bytes=t.peak_bytes,
                             rel_err=err, note=note, run_copy_gbps=_sig(copy) if copy else None)
        ref = reference_output(dims, world, dtype, heap.device)
        timed = time_ops(decode_ops(heap, dims, world, q, k, v, lens, layout, iters, log), heap, iters, log)
        ref = ref if ref is not None else first_baseline(timed)
        retime = []  # (row, how to time it again) for the second round
        for op, t, out in timed:
            shape_rows.append(row(op.name, op.kind, t, err=rel_err(out, ref), note=op.note))
            retime.append((shape_rows[-1], lambda op=op: time_op(op.fn, heap, iters, 3)))
        bar.step(f"{lab} baselines: " + ", ".join(f"{r.name} {r.device_us:.0f}us" for r in shape_rows)
                 + (f"; a copy of K {copy:.0f} GB/s" if copy else "") + f"; floor {floor_us:.1f}us")
        for s in schedules:
            key = f"decode|{src_hash}|{s}|{'x'.join(str(x) for x in shape)}|w{world}|{dtype}|{device}"
            entry = cache.get(key, {})
            cached = entry.get("split") or ({"BS": entry["BS"]} if "BS" in entry and not free else None)
            cands = [cached] if cached and not _too_many_splits(dims["S"], cached) else split_configs(
                dims, heap.interpret, tune, free, slots)
            too_many = [r for r in map(lambda c: _too_many_splits(dims["S"], c), cands) if r]
            cands = [c for c in cands if not _too_many_splits(dims["S"], c)]
            if not cands:
                try:  # a schedule that does not apply says so, whatever the tile size
                    compile_(s, dims, cfg0)
                    reason = too_many[0]
                except TilecError as e:
                    reason = str(e)
                skip(dims, s, reason)
                continue
            best, reason = None, "no config ran"
            for cfg in cands:
                try:
                    prog = compile_(s, dims, cfg)
                except ScheduleError as e:  # the schedule does not apply to this program: say why
                    reason = str(e)
                    break
                except TilecError as e:  # e.g. this BS does not fit the shape: the other candidates may
                    reason = f"{split_text(cfg)}: {e}"
                    log(f"    {s} {reason}")
                    continue
                try:
                    res = time_prog(prog, data, iters if len(cands) == 1 else max(3, iters // 3), len(cands) == 1)
                except Exception as e:  # e.g. a kernel Triton cannot compile for this GPU: reported, not fatal
                    lines = str(e).strip().splitlines()
                    reason = f"{split_text(cfg)}: {type(e).__name__}: {lines[-1][:240] if lines else ''}"
                    log(f"    {s} {reason}")
                    continue
                if len(cands) > 1:
                    log(f"    tune {s} {split_text(cfg)}: {res[0].device_us:.0f}us")
                if best is None or res[0].device_us < best[1][0].device_us:
                    best = (cfg, res)
            if best is None:
                skip(dims, s, reason)
                continue
            cfg, (t, out, local, heap_bytes) = best
            cache[key] = found[key] = {"split": cfg} if free else {"BS": cfg["BS"]}
            if len(cands) > 1:  # re-time the winner in full (fresh buffers and flags, its graph, its local phase)
                t, out, local, heap_bytes = time_prog(compile_(s, dims, cfg), data, iters, True)
            r = row(s, "tilec", t, {**cfg, "num_warps": NUM_WARPS, "num_stages": NUM_STAGES,
                                    "programs_per_sm": per_sm.get(s, 1)}, rel_err(out, ref))
            retime.append((r, lambda s=s, cfg=cfg, dims=dims, data=data: time_prog(compile_(s, dims, cfg), data,
                                                                                iters, False)[0]))
            r.heap_bytes = heap_bytes
            if local is not None:
                r.local_us = _sig(local * 1e6)
                r.local_frac_of_copy_bw = _sig(nbytes / local / 1e9 / bw)
            shape_rows.append(r)
            alone = "" if local is None else (f"; local phase alone {r.local_us:.0f}us"
                                              f" ({100 * r.local_frac_of_copy_bw:.1f}% of copy)")
            bar.step(f"{lab} {s}: {r.device_us:.0f}us device ({'graph' if t.how == GRAPH else 'eager'}), "
                     f"{r.host_us:.0f}us host, {100 * r.frac_of_copy_bw:.1f}% of copy {split_text(cfg)}{alone}"
                     f"{_wrong(r, tol)}")
        if not heap.interpret:  # the CPU emulation's wall-clock rows are not compared: one round
            second_round(retime, lambda r, t: row(r.name, r.kind, t, r.config, r.rel_err, r.note),
                         ("gbps", "frac_of_copy_bw", "tflops"))
            log(f"    {lab} second round (reverse order; each row keeps its faster): {rounds_text(shape_rows)}")
        rooms.clear()
        del q, k, v, lens, data, ref, timed, retime
        heap.release(mark)
        finish_shape(shape_rows, floor_us)
        bsp = next((r.device_us for r in shape_rows if r.kind == "tilec" and r.name == "bsp"), None)
        for r in shape_rows:
            r.ratio_to_bsp = _sig(bsp / r.device_us) if bsp else None
        rows += shape_rows
        if not heap.interpret:
            torch.cuda.empty_cache()  # the next shape's KV must not wait behind this one's cached blocks
    bar.close()
    if heap.rank == 0:
        store_tuned(found)
    return {"rows": [asdict(r) for r in rows], "skipped": skipped, "link_rtt_us": rtt}


def link_rtt_us(heap, world: int, iters: int) -> float | None:
    """One measured link round trip (world > 1, one GPU per rank): the device time of a 4-byte NCCL all-gather
    replayed from a CUDA graph, an upper bound of what a flag's round trip costs; None otherwise."""
    from tilec.perf.bench_baselines import _nccl_group, _one_gpu_per_rank

    if world == 1 or heap.interpret or not _one_gpu_per_rank(heap.device, world):
        return None
    import torch.distributed as dist

    grp = _nccl_group()
    x = torch.ones(1, dtype=torch.int32, device=heap.device)
    y = torch.empty(world, dtype=torch.int32, device=heap.device)
    return time_op(lambda: dist.all_gather_into_tensor(y, x, group=grp), heap, max(20, iters), 3).device_us


def prepare(path: str, shapes: list[tuple[int, ...]], world: int, dtype: str, interpret: bool,
            per_sm: int | None = None) -> int:
    """Checks the program against the decode contract (before any rank starts) and returns the heap each rank
    needs: the largest program's internal buffers and symmetric tensors over the shapes and the tile sizes that
    may run (inputs live in ordinary device memory); per_sm: the programs_per_sm option the splits are sized for."""
    from tilec.api import _retype
    from tilec.frontend.parser import parse_file
    from tilec.frontend.sema import check
    from tilec.ir.dtypes import DTYPES

    ast = parse_file(path)
    if dtype != "f16":
        ast = _retype(ast, {"f16": dtype})
    esz = {dt: torch.empty((), dtype=getattr(torch, name)).element_size() for dt, name in DTYPES.items()}
    worst = 0
    for shape in shapes:
        dims = shape_dims(shape)
        slots = None if interpret else resident_programs(per_sm)
        cfgs = split_configs(dims, interpret, True, free_splits(ast), slots)
        cfgs = [c for c in cfgs if not _too_many_splits(dims["S"], c)]
        # the most splits: the most partials to hold
        bound = check(ast, world, {**dims, **(max(cfgs, key=lambda c: split_count(dims["S"], c)) if cfgs
                                              else split_configs(dims, interpret, False, free_splits(ast), slots)[0])})
        check_signature(bound, path)
        if cfgs:
            worst = max(worst, sum(math.prod(t.shape) * esz[t.dtype] for t in bound.tensors
                                   if t.kind == "buf" or t.symmetric))
    return int(worst * 1.25) + (64 << 20)


def kernel_time(fn, heap, iters: int, timer) -> float:
    """Seconds of the kernels `fn` queues, as `tilec calibrate` times its copy: tilec.perf.gpu_time.cold_time (each
    launch after a clean L2 flush, median; the host's launch path hidden behind the flush); the CPU emulation has
    no such thing and takes the bench's per-call timer."""
    if heap.interpret:
        return timer(fn, heap, iters, 1)
    from tilec.perf.gpu_time import cold_time

    return cold_time(fn, reps=max(20, iters * 2))


def copy_gbps(src: torch.Tensor, heap, iters: int) -> float:
    """Device copy bandwidth on `src` (the shape's K): read + write bytes per second in GB/s, timed like
    `tilec calibrate`'s copy (kernel_time)."""
    dst = torch.empty_like(src)
    return 2 * src.numel() * src.element_size() / kernel_time(lambda: dst.copy_(src), heap, iters, None) / 1e9


def local_phase_time(prog, heap, args: dict, iters: int, timer=None) -> float | None:
    """Seconds of a bsp schedule's local phase alone (local_phase's kernels, `only=`), timed as kernel_time times
    the copy; None for schedules without one. Call the program once on `args` first (it sizes its grids)."""
    phase = local_phase(prog)
    if not phase:
        return None
    return kernel_time(lambda: prog(heap, entry_barrier=False, sync=False, only=phase, **args), heap, iters, timer)


def local_phase(prog) -> tuple[int, ...] | None:
    """The kernels of a bsp schedule before its first barrier (at least two: a program of one kernel has no
    phase to single out); None for other schedules."""
    if prog.schedule != "bsp":
        return None
    kernels = prog.module.KERNELS
    n = next((i for i, k in enumerate(kernels) if k[4]), len(kernels))
    return tuple(range(n)) if 0 < n < len(kernels) else None


def table(rows: list[dict], skipped: list[dict]) -> None:
    """The common columns (tilec.perf.bench.table_text) plus GB/s of KV streamed, its share of the run's copy
    bandwidth, the ratio to tilec's bsp and bsp's local phase alone."""
    print(table_text(rows))
    print(f"\n{'shape':<18}{'name':<30}{'GB/s':>8}{'%copy':>8}{'vs bsp':>10}{'run copy':>10}{'local us':>10}"
          f"{'%copy':>8}")
    for r in rows:
        bsp = f"{r['ratio_to_bsp']:.3g}x" if r["ratio_to_bsp"] is not None else "-"
        copy = f"{r['run_copy_gbps']:.0f}" if r.get("run_copy_gbps") else "-"
        local = "" if r.get("local_us") is None else \
            f"{r['local_us']:>10.1f}{100 * r['local_frac_of_copy_bw']:>7.1f}%"
        print(f"{r['label']:<18}{r['name'][:29]:<30}{r['gbps']:>8.0f}{100 * r['frac_of_copy_bw']:>7.1f}%{bsp:>10}"
              f"{copy:>10}{local}")
    for s in skipped:
        print(f"{s['label']:<18}{s['name']:<30}skipped: {s['reason'][:160]}")
