"""GPU: transport=dma (copy stages on the copy engines) against torch, 1/2/4 ranks on the visible GPU(s) (ranks
may share one GPU), ragged shapes, strided 2-D chunks (a column gather), CUDA-graph replays, and no SM kernel
for the copies."""

import math

import pytest
import torch

from tilec.runtime import spawn

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

TOL = {"bf16": 3e-2, "f16": 1e-2}


def _cases(w: int):
    ag = "examples/ag_gemm.tile"
    out = []
    for sched in ("flags", "fused-push"):
        for gran in ("auto", "rank"):
            out.append((ag, sched, gran, "bf16", {"M": 512 * w, "N": 384, "K": 256}))
            out.append((ag, sched, gran, "f16", {"M": 37 * w, "N": 200, "K": 136}))  # ragged rows and columns
    out.append(("tests/programs/ag_gemm_k.tile", "flags", "auto", "bf16", {"M": 100, "N": 96, "K": 40 * w}))
    return out


@pytest.mark.parametrize("world", [1, 2, 4])
def test_dma_ag_gemm_matches_torch(world):
    res = spawn("tests.gpu.dma_workers:dma_cases", world, backend="iris", heap_bytes=1 << 28, timeout=900,
                args=(_cases(world),))
    bad = [(rank, case, errs) for rank, rows in enumerate(res) for case, errs in rows
           if not all(math.isfinite(e) and e <= TOL[case[3]] for e in errs)]
    assert not bad, bad


@pytest.mark.world(2)
@pytest.mark.parametrize("schedule", ["flags", "fused-push"])
def test_dma_captured_as_cuda_graph(schedule):
    res = spawn("tests.gpu.dma_workers:captured", 2, backend="iris", heap_bytes=1 << 26, timeout=600,
                args=(schedule,))
    assert all(len(errs) == 5 and max(errs) < TOL["bf16"] for errs in res), res


@pytest.mark.world(2)
def test_dma_call_runs_no_copy_kernel():
    names = spawn("tests.gpu.dma_workers:kernels_of_a_call", 2, backend="iris", heap_bytes=1 << 26, timeout=600)
    for rank_names in names:
        kernels = [n for n in rank_names if not n.lower().startswith("memcpy") and "memset" not in n.lower()]
        # the GEMM (k0_gemm), and the NaN poison of nobody: the copies and flag writes are memcpys
        assert all("k0_gemm" in n for n in kernels), rank_names
