"""`tilec bench` on the CPU backend: family from the program's dims, the GEMM and flash-decode paths end to end
(world 1, one iteration, no tuning, results in a tmp folder), and the decode baselines' torch math."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

import tilec
from tests._util import PROGRAMS, ROOT
from tests.fd_workers import attention_reference, make_case
from tilec.errors import ScheduleError, TilecError
from tilec.passes.schedules import SCHEDULES
from tilec.perf import bench, bench_decode, inputs
from tilec.perf.bench_baselines import local_attention_lse, lse_combine

GEMM = str(ROOT / "examples" / "ag_gemm.tile")
DECODE = str(ROOT / "examples" / "flash_decode.tile")
SPLITS = str(ROOT / "examples" / "flash_decode_splits.tile")


def _applies(path: str, dims: dict) -> list[str]:
    out = []
    for s in SCHEDULES:
        try:
            tilec.compile(path, world=1, schedule=s, dims=dims)
            out.append(s)
        except ScheduleError:
            pass
    return out


def _finite_positive(rows: list[dict]) -> bool:
    return all(math.isfinite(r["device_us"]) and r["device_us"] > 0 and r["p10_us"] <= r["device_us"] <= r["p90_us"]
               and r["min_us"] <= r["p10_us"] and r["p90_us"] <= r["max_us"] for r in rows)


def test_family_comes_from_the_dims():
    assert bench.program_family(GEMM) == "gemm"
    assert bench.program_family(DECODE) == "decode"
    with pytest.raises(TilecError, match=r"dims M, N, K.*dims B, HKV, G, D, S") as e:
        bench.program_family(str(PROGRAMS / "elementwise.tile"))
    assert "neither" in str(e.value)


def test_shape_set_of_the_other_family_is_refused(tmp_path):
    with pytest.raises(TilecError, match="decode-small is a decode set"):
        bench.run_bench(GEMM, 1, "decode-small", None, "f16", 1, False, str(tmp_path), "cpu")
    with pytest.raises(TilecError, match="choose from decode-paper, decode-quick, decode-small"):
        bench.run_bench(DECODE, 1, "paper", None, "f16", 1, False, str(tmp_path), "cpu")


def test_gemm_bench_cpu(tmp_path, monkeypatch):
    # the GEMM path on one tiny shape (the interpreter needs ~1 s per 64x64 tile task): the floor, the world-1
    # baseline and every schedule on the same inputs, each output checked against torch
    monkeypatch.setitem(bench.SHAPES, "small", [(128, 128, 64)])
    rows = bench.run_bench(GEMM, 1, "small", None, "bf16", 2, False, str(tmp_path), "cpu")
    js = json.loads((tmp_path / "ag_gemm_small_bf16.json").read_text())
    assert js["rows"] == rows and js["meta"]["world"] == 1 and "metric" not in js["meta"]
    assert "floor" in js["meta"] and "timing" in js["meta"] and js["meta"]["iters"] == 2
    names = [r["name"] for r in rows]
    assert names == ["cublas floor", "cublas", *_applies(GEMM, {"M": 128, "N": 128, "K": 64})]
    assert [r["kind"] for r in rows[:2]] == ["floor", "baseline"] and all(r["kind"] == "tilec" for r in rows[2:])
    assert _finite_positive(rows) and all(r["tflops"] > 0 and r["iters"] == 2 for r in rows)
    assert all(r["timing"].startswith("wall clock") and r["host_us"] > 0 for r in rows)  # the CPU has no events
    floor = rows[0]["device_us"]
    for r in rows:
        assert r["best_baseline"] == "cublas" and r["floor_us"] == pytest.approx(floor, rel=1e-3)
        assert r["ratio_to_best_baseline"] == pytest.approx(rows[1]["device_us"] / r["device_us"], rel=1e-3)
        assert r["frac_of_floor"] == pytest.approx(floor / r["device_us"], rel=1e-3)
        if r["kind"] != "floor":  # every row's C against torch (f32 matmul of the same inputs)
            assert r["rel_err"] is not None and r["rel_err"] < 5e-2, r
    assert all(r["heap_bytes"] > 0 for r in rows if r["kind"] == "tilec")


@pytest.mark.slow  # a multi-rank run of many seconds: not in the quick selection
def test_decode_bench_cpu(tmp_path):
    rows = bench.run_bench(DECODE, 1, "decode-small", None, "bf16", 2, False, str(tmp_path), "cpu")
    js = json.loads((tmp_path / "flash_decode_decode-small_bf16.json").read_text())
    meta = js["meta"]
    assert js["rows"] == rows and meta["family"] == "decode" and meta["metric"] == "gbps"
    try:
        import matplotlib  # noqa: F401 - the plot is drawn when matplotlib is there
    except ImportError:
        pass
    else:
        assert (tmp_path / "flash_decode_decode-small_bf16.png").exists()
    shapes = bench_decode.DECODE_SHAPES["decode-small"]
    applies = _applies(DECODE, {**bench_decode.shape_dims(shapes[0]), "BS": 32})
    assert "bsp" in applies and "fused-pull" not in applies
    for shape in shapes:
        dims = bench_decode.shape_dims(shape)
        mine = [r for r in rows if r["shape"] == dims]
        assert [r["name"] for r in mine] == ["torch sdpa", *applies]  # SDPA with lse: GPU kernels only
        kv = 2 * dims["B"] * dims["S"] * dims["HKV"] * dims["D"] * 2
        bsp = next(r for r in mine if r["name"] == "bsp")
        for r in mine:
            assert r["kv_bytes"] == kv
            assert math.isclose(r["gbps"], kv / r["device_us"] / 1e3, rel_tol=1e-3)
            assert r["floor_us"] == pytest.approx(kv / 4200 / 1e3, rel=1e-3)  # no copy timed on the CPU
            assert r["run_copy_gbps"] is None and math.isclose(r["frac_of_copy_bw"], r["gbps"] / 4200, rel_tol=1e-3)
            # only bsp times its local phase (split + local merge) alone; on the CPU both are wall clock of the
            # interpreter, which a busy machine stretches either way (no order between them is asserted here)
            assert (r["local_us"] is not None) == (r["name"] == "bsp")
            if r["local_us"] is not None:
                assert 0 < r["local_us"]
                assert math.isclose(r["local_frac_of_copy_bw"], kv / r["local_us"] / 1e3 / 4200, rel_tol=1e-3)
            assert math.isclose(r["ratio_to_bsp"], bsp["device_us"] / r["device_us"], rel_tol=1e-3)
            assert r["ratio_to_best_baseline"] > 0 and r["rel_err"] is not None and r["rel_err"] < 2e-2
        assert all(r["config"]["BS"] == 32 for r in mine if r["kind"] == "tilec")
    assert _finite_positive(rows)
    why = [s for s in meta["skipped"] if s["name"] == "fused-pull"]
    assert len(why) == len(shapes) and all("does not apply" in s["reason"] for s in why)


def test_decode_paper_sets_and_split_cap():
    paper = bench_decode.DECODE_SHAPES["decode-paper"]
    assert {s[4] for s in paper} == {k * 1024 for k in (8, 16, 32, 64, 128, 256, 1024)}
    assert {s[1] * s[2] for s in paper} == {96, 128} and {s[2] for s in paper} == {8} and {s[3] for s in paper} == {128}
    assert {s[0] for s in paper} == {1, 8, 32}
    assert all(s[4] in (16 * 1024, 64 * 1024) for s in paper if s[0] > 1)
    assert set(bench_decode.DECODE_SHAPES["decode-quick"]) <= set(paper)
    # without --tune, the fewest waves of (BS + overhead) keys on 264 resident programs (an H200's), a last wave
    # costing at least the 0.7 of them that saturate HBM: the fastest of 512 / 1024 / 2048 measured
    # (decode_stream_probe.log) at 32K, 16 KV heads in one wave of 256 tasks of 2048 keys, 12 heads in one of 192
    # (72 programs idle, and still faster than three waves of 512); at 64K the same one wave of 192 tasks
    dims = bench_decode.shape_dims
    assert bench_decode.default_bs(dims((1, 16, 8, 128, 32768)), False, 264) == 2048
    assert bench_decode.default_bs(dims((1, 12, 8, 128, 32768)), False, 264) == 2048
    assert bench_decode.default_bs(dims((1, 12, 8, 128, 65536)), False, 264) == 4096
    assert bench_decode.default_bs(dims((1, 16, 8, 128, 32768)), False, 528) == 1024  # twice the programs
    assert bench_decode.default_bs(dims((1, 16, 8, 128, 32768)), True) == bench_decode.CPU_BS
    if not torch.cuda.is_available():  # resident_programs() is then the H200's 264
        assert bench_decode.candidates(dims((1, 16, 8, 128, 8192)), False, False) == [512]
        assert bench_decode.candidates(dims((1, 16, 8, 128, 8192)), False, True) == [128, 256, 512, 1024]
        assert bench_decode.candidates(dims((1, 12, 8, 128, 1024 * 1024)), False, False) == [16384]
        assert bench_decode.candidates(dims((32, 16, 8, 128, 16384)), False, False) == [16384]
        # --programs-per-sm 4: twice the resident programs, so half the keys a split (as with 528 above)
        four = bench_decode.resident_programs(4)
        assert four == 528 and bench_decode.split_configs(dims((1, 16, 8, 128, 32768)), False, False, False,
                                                          four) == [{"BS": 1024}]
    for shape in paper:  # every paper shape gets one within the split cap, and tasks for most resident programs
        d = dims(shape)
        bs = bench_decode.default_bs(d, False, 264)
        assert bench_decode._too_many_splits(d["S"], {"BS": bs}) is None
        assert d["B"] * d["HKV"] * d["S"] // bs >= 0.7 * 264
    assert "splits" in bench_decode._too_many_splits(1024 * 1024, {"BS": 128})
    assert bench_decode.prepare(DECODE, paper, 1, "bf16", False) > 64 << 20


def test_default_split_is_the_fastest_measured():
    """default_bs against the split kernels timed on an H200 (the emitted form, split stage alone, every split of a
    shape in one run): for each of the 10 shapes (8K-1M, 96 and 128 heads) it picks the fastest, or one wave of
    splits within 2% of a faster split that needs several (whose KV heads then merge one head after another in
    their last split: at 96 heads, 128K keys 2048-key splits took 197.4 us alone and 278 us as the whole step,
    benchmarks/results/h200-1gpu/decode_tail/fd_paper.log)."""
    runs: dict[tuple[int, int], dict[int, float]] = {}
    for name in ("decode_split_sweep.log", "decode_stream_probe_first.log"):
        for line in (ROOT / "benchmarks" / "results" / "h200-1gpu" / "decode_configs" / name).read_text().splitlines():
            m = re.match(r"S=(\d+) H=(\d+) BS=(\d+) programs=\d+ nowhere\s+:\s+([\d.]+) us", line)
            if m:
                runs.setdefault((int(m[1]), int(m[2]) // 8), {})[int(m[3])] = float(m[4])
    assert len(runs) == 10
    for (s, hkv), times in runs.items():
        pick = bench_decode.default_bs(dict(B=1, HKV=hkv, G=8, D=128, S=s), False, 264)
        best = min(times, key=times.get)
        one_wave = hkv * s // pick <= 264 < hkv * s // best
        assert pick == best or (one_wave and times[pick] <= 1.02 * times[best]), (s, hkv, pick, times)
    assert bench_decode.default_bs(dict(B=1, HKV=12, G=8, D=128, S=131072), False, 264) == 8192


def test_decode_signature_is_checked(tmp_path):
    src = (ROOT / "examples" / "flash_decode.tile").read_text().replace("lens", "lengths")
    p = tmp_path / "fd_renamed.tile"
    p.write_text(src)
    with pytest.raises(TilecError, match=r"feeds in Q\[B, HKV\*G, D\].*lengths"):
        bench_decode.prepare(str(p), [(1, 2, 4, 32, 64)], 1, "f16", True)


def test_kv_layouts():
    """The decode bench feeds a head-major or a position-major cache as the program declares it: the same values
    (same seeds), and SDPA gets them head-major either way."""
    dims = dict(B=2, HKV=3, G=2, D=8, S=16)
    cpu = torch.device("cpu")
    _q, k, v, _l = inputs.make_inputs(dims, 1, 0, "f32", cpu)
    _q, kh, vh, _l = inputs.make_inputs(dims, 1, 0, "f32", cpu, layout="bhsd")
    assert torch.equal(kh, k.transpose(1, 2)) and torch.equal(vh, v.transpose(1, 2)) and kh.is_contiguous()
    assert inputs.kv_layout(k.shape, dims) == "bshd" and inputs.kv_layout(kh.shape, dims) == "bhsd"
    with pytest.raises(TilecError, match=r"K \[2, 16, 8, 3\]"):
        inputs.kv_layout((2, 16, 8, 3), dims)
    assert bench_decode._declared_shape(DECODE, 1, dims, "K", {"BS": 8}) == (2, 3, 16, 8)  # the example: head-major
    assert bench_decode._declared_shape(SPLITS, 1, dims, "K", {"NS": 3, "L": 6, "BS": 8}) == (2, 3, 18, 8)  # room
    roomy = inputs.with_room(kh, "bhsd", 18)
    assert roomy.shape == (2, 3, 18, 8) and torch.equal(roomy[:, :, :16], kh) and not roomy[:, :, 16:].any()
    assert inputs.with_room(k, "bshd", 16) is k
    with pytest.raises(TilecError, match=r"room for 12 positions \(NS\*L\) cannot hold the S = 16"):
        inputs.with_room(k, "bshd", 12)


@pytest.mark.parametrize("world", [1, 3])
def test_torch_lse_baseline_matches_reference(world):
    """The NCCL baseline's math without NCCL: each rank's (o, lse) from torch ops, then the LSE combine; ragged
    lengths, an empty sequence and empty shards included."""
    dims = dict(B=3, HKV=2, G=4, D=32, S=40)
    q, ks, vs, lens = make_case(world, dims, "f32", 7, poison=False)  # a dense P.V: masked slots must be finite
    os_, ls_ = [], []
    for r in range(world):
        n_local = (lens.to(torch.int64) - r * dims["S"]).clamp(0, dims["S"])
        o, lse = local_attention_lse(q, ks[r].transpose(1, 2).contiguous(), vs[r].transpose(1, 2).contiguous(),
                                     n_local, dims["G"])
        os_.append(o)
        ls_.append(lse)
    got = lse_combine(torch.stack(os_), torch.stack(ls_))
    want = attention_reference(q, ks, vs, lens, dims["G"])
    assert torch.isfinite(got).all()
    assert float((got - want).abs().max()) < 1e-5


def test_reference_output_matches_torch():
    dims = dict(B=2, HKV=1, G=8, D=32, S=48)
    world = 2
    ref = bench_decode.reference_output(dims, world, "bf16", torch.device("cpu"))
    blocks = [inputs.make_inputs(dims, world, r, "bf16", torch.device("cpu")) for r in range(world)]
    q, lens = blocks[0][0], blocks[0][3]
    assert all(torch.equal(b[0], q) for b in blocks) and not torch.equal(blocks[0][1], blocks[1][1])
    want = attention_reference(q, [b[1] for b in blocks], [b[2] for b in blocks], lens, dims["G"])
    assert float((ref - want).abs().max()) < 1e-4


def _nccl_path_on_gloo(heap, dims):
    """Rank side: the world > 1 decode ops with the rendezvous group standing in for NCCL (SDPA with lse needs a
    GPU kernel, so on the CPU only the naive torch step runs, labelled a reference), against the whole op
    recomputed on the rank."""
    import torch.distributed as dist

    from tilec.perf import bench_baselines

    bench_baselines._one_gpu_per_rank = lambda dev, world: True
    bench_baselines._groups["nccl"] = dist.group.WORLD
    q, k, v, lens = inputs.make_inputs(dims, heap.world, heap.rank, "f32", heap.device)
    ops = bench_baselines.decode_ops(heap, dims, heap.world, q, k, v, lens, "bshd", 2, lambda *_: None)
    ref = bench_decode.reference_output(dims, heap.world, "f32", heap.device)
    return [(op.name, op.kind, bench_decode.rel_err(op.fn(), ref)) for op in ops]


@pytest.mark.slow  # a multi-rank run of many seconds: not in the quick selection
def test_distributed_baseline_on_gloo():
    from tilec.runtime import spawn

    dims = dict(B=2, HKV=2, G=4, D=32, S=48)
    results = spawn("tests.test_bench_cpu:_nccl_path_on_gloo", 2, args=(dims,), heap_bytes=1 << 20, timeout=120)
    for rows in results:
        assert [(r[0], r[1]) for r in rows] == [("torch attention+nccl", "reference")]
        assert rows[0][2] < 1e-5


def _gemm_baselines_on_gloo(heap, dims):
    """Rank side: the NCCL baselines of the three GEMM patterns (all_gather_into_tensor + matmul, matmul +
    reduce_scatter_tensor, matmul + all_reduce) with the rendezvous group standing in for NCCL, each output against
    torch on every rank's inputs; the symmetric-memory baselines need GPUs and are left out."""
    import torch.distributed as dist

    from tilec.perf import bench_baselines

    bench_baselines._one_gpu_per_rank = lambda dev, world: True
    bench_baselines._groups["nccl"] = dist.group.WORLD
    out = {}
    for p in ("ag", "rs", "ar"):
        a, b = inputs.gemm_inputs(p, dims, heap.world, heap.rank, "f32", heap.device)
        ref = inputs.gemm_reference(p, dims, heap.world, heap.rank, "f32", heap.device)
        out[p] = [(op.name, op.kind, bench.rel_err(op.fn(), ref))
                  for op in bench_baselines.gemm_ops(heap, heap.world, p, a, b, lambda *_: None)]
    return out


@pytest.mark.slow  # a multi-rank run of many seconds: not in the quick selection
def test_gemm_baselines_on_gloo():
    """The distributed GEMM baselines' code paths (they only run with one GPU per rank) on 2 CPU ranks."""
    from tilec.runtime import spawn

    results = spawn("tests.test_bench_cpu:_gemm_baselines_on_gloo", 2, args=({"M": 64, "N": 32, "K": 48},),
                    heap_bytes=1 << 20, timeout=120)
    for rows in results:
        for p in ("ag", "rs", "ar"):
            assert [(n, k) for n, k, _ in rows[p]] == [("nccl+cublas", "baseline")]
            assert rows[p][0][2] < 1e-5, (p, rows[p])


def test_gemm_pattern_picks_the_baselines_of_each_example():
    from tilec.perf.bench_baselines import gemm_pattern

    dims = {"M": 256, "N": 128, "K": 256}
    got = {e: gemm_pattern(f"examples/{e}.tile", 2, dims) for e in ("ag_gemm", "gemm_rs", "gemm_ar")}
    assert got == {"ag_gemm": "ag", "gemm_rs": "rs", "gemm_ar": "ar"}
    assert gemm_pattern("examples/gemm_rs.tile", 1, dims) == "ag"  # world 1: every pattern is a plain matmul


def test_second_round_keeps_each_rows_faster_round():
    """rows.second_round (both benches): every row timed again in reverse order; a row keeps its faster round
    (timing fields and the given rates rebuilt from it), records both medians, and keeps its first round when the
    second fails."""
    from types import SimpleNamespace

    from tilec.perf.measure import Timing

    def timing(us):
        return Timing(us, us - 1, us + 1, us - 2, us + 2, 20, "graph", host_us=50.0)

    def row(name, kind, t, config=None, err=None, note=""):
        return SimpleNamespace(name=name, kind=kind, config=config, rel_err=err, note=note, device_us=t.device_us,
                               p10_us=t.p10_us, p90_us=t.p90_us, min_us=t.min_us, max_us=t.max_us, iters=t.iters,
                               timing=t.how, gbps=1000 / t.device_us, frac_of_copy_bw=0.1, tflops=0.0)

    order = []

    def again(name, us):
        def fn():
            order.append(name)
            if us is None:
                raise RuntimeError("out of memory")
            return timing(us)
        return fn

    slow_first = row("sdpa", "baseline", timing(280.0))
    fast_first = row("fused-push", "tilec", timing(250.0))
    failing = row("flags", "tilec", timing(300.0))
    from tilec.perf.rows import second_round

    second_round([(slow_first, again("sdpa", 244.0)), (fast_first, again("fused-push", 260.0)),
                  (failing, again("flags", None))], lambda r, t: row(r.name, r.kind, t, r.config, r.rel_err, r.note),
                 ("gbps",))
    assert order == ["flags", "fused-push", "sdpa"]  # the reverse of the first round
    assert (slow_first.device_us, slow_first.p90_us, slow_first.rounds_us) == (244.0, 245.0, [280.0, 244.0])
    assert slow_first.gbps == pytest.approx(1000 / 244.0)
    assert (fast_first.device_us, fast_first.rounds_us) == (250.0, [250.0, 260.0])
    assert (failing.device_us, failing.rounds_us) == (300.0, [300.0])



def test_default_splits_fill_every_sm_twice():
    """default_splits of a free-split program against the H200 runs
    (benchmarks/results/h200-1gpu/decode_splits/ragged_probe*.log): 96 heads at 64K take 22 splits of 3008 keys (264
    tasks, two on each of 132 SMs: 104 us) over 16 of 4096 (192 tasks: 110-117 us) and 11 of 6016 (one a SM: 121 us);
    128 heads keep 16 splits; batch 8 two; batch 32 (more KV heads than programs) one; the CPU emulation CPU_BS."""
    dims = bench_decode.shape_dims
    pick = lambda shape: bench_decode.default_splits(dims(shape), False, 264, 132)  # noqa: E731
    assert pick((1, 12, 8, 128, 65536)) == {"NS": 22, "L": 3008, "BS": 4096}
    assert pick((1, 12, 8, 128, 8192)) == {"NS": 22, "L": 384, "BS": 512}
    assert pick((1, 16, 8, 128, 8192)) == {"NS": 16, "L": 512, "BS": 512}
    assert pick((8, 16, 8, 128, 16384)) == {"NS": 2, "L": 8192, "BS": 8192}
    assert pick((32, 16, 8, 128, 16384)) == {"NS": 1, "L": 16384, "BS": 16384}
    for shape in bench_decode.DECODE_SHAPES["decode-paper"]:
        cfg = pick(shape)
        d = dims(shape)
        assert cfg["NS"] * cfg["L"] >= d["S"] > (cfg["NS"] - 1) * cfg["L"]  # no empty split, room for every key
        assert cfg["L"] % bench_decode.SPLIT_ALIGN == 0 and cfg["L"] <= cfg["BS"] < 2 * cfg["L"]
        assert bench_decode._too_many_splits(d["S"], cfg) is None
    assert bench_decode.default_splits(dims((2, 1, 8, 32, 96)), True) == {"NS": 4, "L": 24, "BS": 32}
    assert bench_decode.default_splits(dims((1, 2, 4, 32, 64)), True) == {"NS": 3, "L": 24, "BS": 32}  # room 72
    assert inputs.kv_room({"S": 100, "NS": 3, "L": 40, "BS": 64}) == 120
    assert inputs.kv_room({"S": 100, "NS": 3, "BS": 64}) == 100  # a dim NS alone is not a free split
    ranked = bench_decode.ranked_splits(dims((1, 12, 8, 128, 65536)), False, 264, 132)
    assert [c["NS"] for c in ranked[:3]] == [22, 21, 20]  # two tasks on (nearly) every SM before one on some
    assert all(12 * c["NS"] <= 264 for c in ranked)  # one wave
    if not torch.cuda.is_available():  # resident_programs() is then the H200's 264
        assert bench_decode.split_configs(dims((1, 12, 8, 128, 65536)), False, True, True) == ranked[:3]
        assert bench_decode.split_configs(dims((1, 12, 8, 128, 65536)), False, False, True) == ranked[:1]


@pytest.mark.parametrize("shapes", [1, pytest.param(None, marks=pytest.mark.slow)], ids=["first-shape", "every-shape"])
def test_decode_bench_cpu_free_splits(tmp_path, monkeypatch, shapes):
    """The bench on examples/flash_decode_splits.tile: the cache block with room for NS*L positions, every row right
    (the quick run on the first shape of decode-small: two ranks in the interpreter take ~15 s a shape)."""
    if shapes is not None:
        monkeypatch.setitem(bench_decode.DECODE_SHAPES, "decode-small", bench_decode.DECODE_SHAPES["decode-small"][:1])
    rows = bench.run_bench(SPLITS, 2, "decode-small", ["fused-push"], "f16", 2, False, str(tmp_path), "cpu")
    mine = [r for r in rows if r["kind"] == "tilec"]
    assert len(mine) == len(bench_decode.DECODE_SHAPES["decode-small"])
    for r in mine:
        s = r["shape"]["S"]
        assert r["config"]["NS"] == -(-s // 32) + 1 and r["config"]["L"] == 24 and r["rel_err"] < 1e-2


def test_bench_compile_options_reach_every_timed_program(tmp_path, monkeypatch):
    """`tilec bench --fold off --programs-per-sm 1`: the JSON says what the tilec rows were built with, and their
    times land under that build's key (auto reads them only for programs built so), not the default build's."""
    from tilec.cli import main as cli_main
    from tilec.perf.auto import CPU_KEY, key
    from tilec.settings import options

    monkeypatch.setenv("TILEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setitem(bench.SHAPES, "small", [(64, 64, 64)])
    assert cli_main(["bench", GEMM, "--world", "1", "--backend", "cpu", "--schedules", "fused-push", "--no-tune",
                     "--iters", "1", "--fold", "off", "--programs-per-sm", "1", "--out", str(tmp_path)]) == 0
    js = json.loads((tmp_path / "ag_gemm_small_bf16.json").read_text())
    assert "fold=off" in js["meta"]["options"] and "programs_per_sm=1" in js["meta"]["options"]
    saved = json.loads((tmp_path / "cache" / "auto.json").read_text())
    dims = {"M": 64, "N": 64, "K": 64}
    src = open(GEMM).read()
    built = key(src, 1, dims, CPU_KEY, options=options(fold=False, programs_per_sm=1))
    assert "fused-push" in saved[built]["measured"] and key(src, 1, dims, CPU_KEY) not in saved
