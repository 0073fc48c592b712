"""The cost model of one rank among W side by side on one GPU under MPS (tilec.perf.model.mps_rank), and `auto`'s
use of it: a rank computes at its SMs' share of the GPU, a peer's memory is that GPU's HBM, and fused-pull's re-reads
of a peer (ruled out over NVLink) are then HBM and L2 reads that the model may rank."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tilec.perf import auto
from tilec.perf.model import Machine, mps_rank
from tilec.perf.taxes import TaxRow, taxes

DIMS = dict(M=8192, N=4608, K=36864, BM=128, BN=256, BK=64)  # AG+GEMM, a paper shape, Hopper tiles


def test_a_rank_under_mps_has_its_share_of_the_gpu():
    m = mps_rank(Machine(), 2, 66)
    assert (m.gemm_tflops, m.sms, m.link, m.link_GBps) == (375.0, 66, "hbm", 2100.0)
    full, half = ({r.schedule: r for r in taxes("examples/ag_gemm.tile", 2, DIMS, mach, schedules=("bsp",))}
                  for mach in (Machine(), m))
    assert half["bsp"].compute_us == 2 * full["bsp"].compute_us  # the same tiles on half the SMs


def test_auto_ranks_fused_pull_where_peers_are_on_the_same_gpu(monkeypatch):
    over_nvlink = [s for s, _ in auto.rank_schedules("examples/ag_gemm.tile", 2, DIMS, Machine(), transports=("sm",))]
    assert "fused-pull" not in over_nvlink  # its 5.4 GB of re-reads per call over NVLink
    monkeypatch.delenv("TILEC_MACHINE", raising=False)
    monkeypatch.setattr("tilec.perf.measure.gpu_sharing", lambda world: "mps")
    monkeypatch.setattr("tilec.perf.measure.mps_sms", lambda: 66)
    m = auto.machine(2)
    assert m == mps_rank(Machine(), 2, 66)
    ranked = dict(auto.rank_schedules("examples/ag_gemm.tile", 2, DIMS, m, transports=("sm",)))
    assert "fused-pull" in ranked and ranked["bsp"] > ranked["fused-pull"]
    assert all(isinstance(r, TaxRow) for r in taxes("examples/ag_gemm.tile", 2, DIMS, m, schedules=("fused-pull",)))


def test_measured_tiles_are_the_benchs_not_the_programs_defaults(monkeypatch):
    """`tilec taxes --measure / --timeline` on a GPU: a GEMM program without -D tiles is timed with tilec bench's
    tuned config for the shape (bsp's), else its first Hopper config; given tiles and warps are kept."""
    import hashlib
    from pathlib import Path
    from types import SimpleNamespace

    import torch

    from tilec.perf import bench
    from tilec.perf.measure import store_tuned

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: SimpleNamespace(multi_processor_count=66))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda dev=None: "NVIDIA H200")
    shape = {"M": 8192, "N": 4608, "K": 36864}
    dims, launch, text = bench.measured_tiles("examples/ag_gemm.tile", 2, shape, {"num_warps": None})
    assert (dims["BM"], dims["BN"], dims["BK"], launch["num_warps"], launch["group_m"]) == (128, 256, 64, 8, 8)
    assert "first config" in text
    kept = bench.measured_tiles("examples/ag_gemm.tile", 2, {**shape, "BM": 64}, {"num_warps": 4})
    assert kept == ({**shape, "BM": 64}, {"num_warps": 4}, "")
    src = hashlib.sha256(Path("examples/ag_gemm.tile").read_bytes()).hexdigest()[:12]
    store_tuned({f"{src}|bsp|8192x4608x36864|w2|bf16|NVIDIA H200": [128, 128, 64, 4, 4, 8]})
    dims, launch, text = bench.measured_tiles("examples/ag_gemm.tile", 2, shape, {"num_warps": 8})
    assert (dims["BN"], launch["num_warps"], launch["num_stages"]) == (128, 8, 4) and "tuned" in text


def _rows(program, world, machine, dims=DIMS, **kw):
    launch = {"num_warps": 8, "num_stages": 3, "group_m": 8, "transport": "sm"}
    return {r.schedule: r for r in taxes(program, world, dims, machine, launch=launch, **kw) if isinstance(r, TaxRow)}


def test_under_mps_host_barriers_wait_for_the_slowest_rank_once_per_stretch_of_work():
    from tilec.perf.model import MPS_BARRIER_SKEW_SHARE, MPS_BARRIER_SKEW_US

    m4 = mps_rank(Machine(), 4, 32)
    assert (m4.barrier_skew_us, m4.barrier_skew_share) == (3 * MPS_BARRIER_SKEW_US, 3 * MPS_BARRIER_SKEW_SHARE)
    assert (Machine().barrier_skew_us, Machine().barrier_skew_share, Machine().start_skew_us) == (0.0, 0.0, 0.0)
    timed = _rows("examples/gemm_rs.tile", 4, m4, entry_barrier=False)  # calls as the bench times them
    bsp = timed["bsp"]
    work = bsp.overlap_us + bsp.serialization_us
    # its one barrier between kernels: the fixed part and the ranks' drift over the call's work
    assert bsp.barrier_us == pytest.approx(m4.barrier_us + m4.barrier_skew_us + m4.barrier_skew_share * work)
    assert timed["fused-push"].barrier_us == 0.0
    called = _rows("examples/gemm_rs.tile", 4, m4)  # entry (and exit) barriers: one stretch more, one drift
    assert called["bsp"].barrier_us == pytest.approx(called["bsp"].barriers * m4.barrier_us + 2 * m4.barrier_skew_us
                                                     + m4.barrier_skew_share * work)
    fp = called["fused-push"]  # one entry barrier
    assert fp.barriers == 1 and fp.barrier_us == pytest.approx(m4.barrier_us + m4.barrier_skew_us
                                                               + m4.barrier_skew_share * (fp.overlap_us
                                                                                          + fp.serialization_us))
    # its flag waits wait for the latest rank's start (world 4); bsp has none
    plain = _rows("examples/gemm_rs.tile", 4, replace(m4, start_skew_us=0.0), entry_barrier=False)
    assert timed["fused-push"].flag_wait_us == pytest.approx(plain["fused-push"].flag_wait_us + m4.start_skew_us)
    assert timed["bsp"].flag_wait_us == plain["bsp"].flag_wait_us


def test_under_mps_gemm_tasks_in_turn_with_copy_tasks_run_slower():
    import math

    from tilec.perf.model import MPS_DOT_BESIDE_COPIES, MPS_DOT_BESIDE_COPIES_PER_K2, _compute_us

    m2 = mps_rank(Machine(), 2, 66)
    plain = replace(m2, dot_beside_copies=1.0, dot_beside_copies_per_k2=0.0)
    ag, ag_plain = _rows("examples/ag_gemm.tile", 2, m2), _rows("examples/ag_gemm.tile", 2, plain)
    gather, gemm = (next(c for c in ag["fused-push"].stage_costs if c.name == n) for n in ("gather", "gemm"))
    factor = 1 + MPS_DOT_BESIDE_COPIES + MPS_DOT_BESIDE_COPIES_PER_K2 * math.log2(DIMS["K"] / 4096)  # K = 36864
    assert ag["fused-push"].compute_us == pytest.approx(_compute_us(gather, m2, 1.0)
                                                        + factor * _compute_us(gemm, m2, 1.0))
    assert ag_plain["fused-push"].compute_us == pytest.approx(_compute_us(gather, m2, 1.0) + _compute_us(gemm, m2, 1.0))
    for s in ("bsp", "fused-pull", "specialized"):  # no copy tasks in turn with the GEMM's on its programs
        assert ag[s].predicted_us == ag_plain[s].predicted_us, s
    rs, rs_plain = _rows("examples/gemm_rs.tile", 2, m2), _rows("examples/gemm_rs.tile", 2, plain)
    assert rs["fused-push"].predicted_us == rs_plain["fused-push"].predicted_us  # its pushes are the GEMM's stores


def test_under_mps_at_world_4_a_rank_computes_faster_than_its_sm_share():
    from tilec.perf.model import MPS_GEMM_SHARE_RATE

    m4 = mps_rank(Machine(), 4, 32)
    assert m4.gemm_tflops == Machine().gemm_tflops * 32 / 132 * MPS_GEMM_SHARE_RATE[4]
    assert mps_rank(Machine(), 3, 44).gemm_tflops == Machine().gemm_tflops * 44 / 132 * 1.05  # between the two
    assert (mps_rank(Machine(), 2, 66).ce_latency_us, mps_rank(Machine(), 4, 32).ce_latency_us) == (
        Machine().ce_latency_us, 250.0)  # the copy engines' per-copy cost at world 4 (paper_shapes, one row)
