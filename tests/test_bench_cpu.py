"""`tilec bench` on the CPU backend: family from the program's dims, the GEMM and flash-decode paths end to end
(world 1, one iteration, no tuning, results in a tmp folder), and the decode baselines' torch math."""

from __future__ import annotations

import json
import math
import os
import re

import pytest
import torch

import tilec
from tests._util import PROGRAMS, ROOT
from tests.fd_workers import attention_reference, make_case
from tilec import bench, bench_decode
from tilec.bench_baselines import local_attention_lse, lse_combine
from tilec.errors import ScheduleError, TilecError
from tilec.passes.schedules import SCHEDULES

GEMM = str(ROOT / "examples" / "ag_gemm.tile")
DECODE = str(ROOT / "examples" / "flash_decode.tile")


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
    return all(math.isfinite(r["median_us"]) and r["median_us"] > 0 for r in rows)


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
    # the GEMM path as before, on one tiny shape (the interpreter needs ~1 s per 64x64 tile task)
    monkeypatch.setitem(bench.SHAPES, "small", [(128, 128, 64)])
    rows = bench.run_bench(GEMM, 1, "small", None, "bf16", 1, False, str(tmp_path), "cpu")
    js = json.loads((tmp_path / "ag_gemm_small_bf16.json").read_text())
    assert js["rows"] == rows and js["meta"]["world"] == 1 and "metric" not in js["meta"]
    names = [r["name"] for r in rows]
    assert names == ["torch.matmul", *_applies(GEMM, {"M": 128, "N": 128, "K": 64})]
    assert _finite_positive(rows) and all(r["tflops"] > 0 for r in rows)
    assert all(set(r) >= {"shape", "name", "kind", "median_us", "tflops", "ratio_to_best_baseline"} for r in rows)
    # every timed schedule's outputs were right (against the reference of the same inputs, itself checked against
    # torch in test_gemm_bench_reference_is_torch)
    assert all(r["rel_err"] is not None and r["rel_err"] < 5e-2 for r in rows if r["kind"] == "tilec")


@pytest.mark.parametrize("example, world", [("ag_gemm", 1), ("ag_gemm", 2), ("gemm_rs", 2)])
def test_gemm_bench_reference_is_torch(example, world, tmp_path):
    """What a bench row's rel_err compares with: the inputs `_inputs` puts on the heap (rebuilt for every rank by
    random_inputs) and the outputs torch computes from them."""
    from tilec.runtime.cpu_heap import ShmHeap, create_shm_files

    dims = {"M": 64, "N": 32, "K": 64}
    prog = tilec.compile(str(ROOT / "examples" / f"{example}.tile"), world=world, schedule="bsp", dims=dims)
    ins = [bench.random_inputs(prog, r, 3) for r in range(world)]
    for rank in range(world):
        got = bench.reference_outputs(prog, rank, 3)
        if example == "ag_gemm":  # C = all A shards stacked @ B
            want = torch.cat([d["A"].float() for d in ins]) @ ins[rank]["B"].float()
        else:  # C (this rank's rows) = sum over ranks of their A[:, K shard] @ B[K shard] partials
            rows = slice(rank * 64 // world, (rank + 1) * 64 // world)
            want = sum(d["A"].float()[rows] @ d["B"].float() for d in ins)
        assert float((got["C"].float() - want).abs().max()) < 2e-2 * max(1.0, float(want.abs().max()))
    tag = f"{os.getpid()}_benchref"
    paths = create_shm_files(1, 1 << 20, tag)
    heap = ShmHeap(0, 1, paths, 1 << 20)
    try:
        one = tilec.compile(str(ROOT / "examples" / f"{example}.tile"), world=1, schedule="bsp", dims=dims)
        args = bench._inputs(one, heap, 3)
        want = bench.random_inputs(one, 0, 3)
        assert want and all(torch.equal(args[n], t) for n, t in want.items())
    finally:
        heap.close()


def test_decode_bench_cpu(tmp_path):
    rows = bench.run_bench(DECODE, 1, "decode-small", None, "bf16", 1, False, str(tmp_path), "cpu")
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
        assert [r["name"] for r in mine] == ["torch sdpa", *applies]
        kv = 2 * dims["B"] * dims["S"] * dims["HKV"] * dims["D"] * 2
        bsp = next(r for r in mine if r["name"] == "bsp")
        for r in mine:
            assert r["kv_bytes"] == kv
            assert math.isclose(r["gbps"], kv / r["median_us"] / 1e3, rel_tol=1e-3)
            assert r["run_copy_gbps"] is None and math.isclose(r["frac_of_copy_bw"], r["gbps"] / 4200, rel_tol=1e-3)
            # only bsp times its local phase (split + local merge) alone: faster than its whole call
            assert (r["local_us"] is not None) == (r["name"] == "bsp")
            if r["local_us"] is not None:
                assert 0 < r["local_us"] < r["median_us"]
                assert math.isclose(r["local_frac_of_copy_bw"], kv / r["local_us"] / 1e3 / 4200, rel_tol=1e-3)
            assert math.isclose(r["ratio_to_bsp"], bsp["median_us"] / r["median_us"], rel_tol=1e-3)
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
    for shape in paper:  # every paper shape gets one within the split cap, and tasks for most resident programs
        d = dims(shape)
        bs = bench_decode.default_bs(d, False, 264)
        assert bench_decode._too_many_splits(d["S"], bs) is None
        assert d["B"] * d["HKV"] * d["S"] // bs >= 0.7 * 264
    assert "splits" in bench_decode._too_many_splits(1024 * 1024, 128)
    assert bench_decode.prepare(DECODE, paper, 1, "bf16", False) > 64 << 20


def test_default_split_is_the_fastest_measured():
    """default_bs against the split kernels timed on an H200 (the emitted form, split stage alone, every split of a
    shape in one run): for each of the 10 shapes (8K-1M, 96 and 128 heads) it picks the fastest."""
    runs: dict[tuple[int, int], dict[int, float]] = {}
    for name in ("decode_split_sweep.log", "decode_stream_probe2.log"):
        for line in (ROOT / "benchmarks" / "results" / "h200-1gpu" / name).read_text().splitlines():
            m = re.match(r"S=(\d+) H=(\d+) BS=(\d+) programs=\d+ nowhere\s+:\s+([\d.]+) us", line)
            if m:
                runs.setdefault((int(m[1]), int(m[2]) // 8), {})[int(m[3])] = float(m[4])
    assert len(runs) == 10
    for (s, hkv), times in runs.items():
        pick = bench_decode.default_bs(dict(B=1, HKV=hkv, G=8, D=128, S=s), False, 264)
        assert pick == min(times, key=times.get), (s, hkv, pick, times)


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
    _q, k, v, _l = bench_decode.make_inputs(dims, 1, 0, "f32", cpu)
    _q, kh, vh, _l = bench_decode.make_inputs(dims, 1, 0, "f32", cpu, layout="bhsd")
    assert torch.equal(kh, k.transpose(1, 2)) and torch.equal(vh, v.transpose(1, 2)) and kh.is_contiguous()
    assert bench_decode.kv_layout(k.shape, dims) == "bshd" and bench_decode.kv_layout(kh.shape, dims) == "bhsd"
    with pytest.raises(TilecError, match=r"K \[2, 16, 8, 3\]"):
        bench_decode.kv_layout((2, 16, 8, 3), dims)
    assert bench_decode._declared_shape(DECODE, 1, dims, "K", 8) == (2, 3, 16, 8)  # the example is head-major


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
    blocks = [bench_decode.make_inputs(dims, world, r, "bf16", torch.device("cpu")) for r in range(world)]
    q, lens = blocks[0][0], blocks[0][3]
    assert all(torch.equal(b[0], q) for b in blocks) and not torch.equal(blocks[0][1], blocks[1][1])
    want = attention_reference(q, [b[1] for b in blocks], [b[2] for b in blocks], lens, dims["G"])
    assert float((ref - want).abs().max()) < 1e-4


def _nccl_path_on_gloo(heap, dims):
    """Rank side: the world > 1 baseline (torch attention with lse, one all_gather_into_tensor, lse combine) with
    the rendezvous group standing in for NCCL, against the whole op recomputed on the rank."""
    import torch.distributed as dist

    from tilec import bench_baselines
    from tilec.bench import _median_time

    bench_baselines._one_gpu_per_rank = lambda dev, world: True
    bench_baselines._groups["nccl"] = dist.group.WORLD
    q, k, v, lens = bench_decode.make_inputs(dims, heap.world, heap.rank, "f32", heap.device)
    res = bench_baselines.decode_baselines(heap, dims, heap.world, "f32", 2, _median_time, q, k, v, lens)
    ref = bench_decode.reference_output(dims, heap.world, "f32", heap.device)
    return [(name, secs, bench_decode.rel_err(out, ref)) for name, secs, _note, out in res]


def test_distributed_baseline_on_gloo():
    from tilec.runtime import spawn

    dims = dict(B=2, HKV=2, G=4, D=32, S=48)
    results = spawn("tests.test_bench_cpu:_nccl_path_on_gloo", 2, args=(dims,), heap_bytes=1 << 20, timeout=120)
    for rows in results:
        assert [r[0] for r in rows] == ["nccl+torch (bsp)"]
        assert rows[0][1] > 0 and rows[0][2] < 1e-5


def _gemm_baselines_on_gloo(heap, dims):
    """Rank side: the NCCL baselines of the three GEMM patterns (all_gather_into_tensor + matmul, matmul +
    reduce_scatter_tensor, matmul + all_reduce) with the rendezvous group standing in for NCCL; the symmetric-memory
    baselines need GPUs and must say so instead of failing the row."""
    import torch.distributed as dist

    from tilec import bench_baselines
    from tilec.bench import _median_time

    bench_baselines._one_gpu_per_rank = lambda dev, world: True
    bench_baselines._groups["nccl"] = dist.group.WORLD
    return {p: [(name, secs) for name, secs, _note in bench_baselines.baselines(heap, dims, heap.world, "f32", 2,
                                                                               _median_time, pattern=p)]
            for p in ("ag", "rs", "ar")}


def test_gemm_baselines_on_gloo():
    """The distributed GEMM baselines' code paths (they only run with one GPU per rank) on 2 CPU ranks."""
    from tilec.runtime import spawn

    results = spawn("tests.test_bench_cpu:_gemm_baselines_on_gloo", 2, args=({"M": 64, "N": 32, "K": 48},),
                    heap_bytes=1 << 20, timeout=120)
    for rows in results:
        assert [n for n, _ in rows["ag"]] == ["nccl+cublas (bsp)"]  # async-TP: no symmetric memory on the CPU
        assert [n for n, _ in rows["rs"]] == ["nccl+cublas (bsp)"]
        assert [n for n, _ in rows["ar"]] == ["nccl+cublas (bsp)"]
        assert all(secs > 0 for r in rows.values() for _, secs in r)


def test_gemm_pattern_picks_the_baselines_of_each_example():
    from tilec.bench_baselines import gemm_pattern

    dims = {"M": 256, "N": 128, "K": 256}
    got = {e: gemm_pattern(f"examples/{e}.tile", 2, dims) for e in ("ag_gemm", "gemm_rs", "gemm_ar")}
    assert got == {"ag_gemm": "ag", "gemm_rs": "rs", "gemm_ar": "ar"}
    assert gemm_pattern("examples/gemm_rs.tile", 1, dims) == "ag"  # world 1: every pattern is a plain matmul
