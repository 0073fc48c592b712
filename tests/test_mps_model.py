"""The cost model of one rank among W side by side on one GPU under MPS (tilec.perf.model.mps_rank), and `auto`'s
use of it: a rank computes at its SMs' share of the GPU, a peer's memory is that GPU's HBM, and fused-pull's re-reads
of a peer (ruled out over NVLink) are then HBM and L2 reads that the model may rank."""

from __future__ import annotations

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
