"""GPU: every schedule of examples/ag_gemm.tile against torch, bf16 and fp16, 1/2/4 ranks on the visible GPU(s)."""

import math

import pytest
import torch

from tilec.runtime import spawn

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

TOL = {"bf16": 3e-2, "f16": 1e-2}


def _cases(world):
    shapes = [(512, 384, 256), (8 * world - world, 200, 136)]  # square-ish, ragged (rows straddle tiles)
    shapes = [(m - m % world, n, k) for m, n, k in shapes]
    return [(s, dt, *shp) for s in ("bsp", "flags", "fused-pull", "fused-push", "specialized") for dt in ("bf16", "f16")
            for shp in shapes]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_ag_gemm_all_schedules(world):
    res = spawn("tests.gpu.gpu_workers:ag_gemm_cases", world, backend="iris", heap_bytes=1 << 28, timeout=900,
                args=(_cases(world),))
    bad = []
    for rank, rows in enumerate(res):
        for case, errs in rows:
            if not all(math.isfinite(e) and e <= TOL[case[1]] for e in errs):
                bad.append((rank, case, errs))
    assert not bad, bad


@pytest.mark.world(2)
@pytest.mark.parametrize("schedule", ["fused-pull", "specialized"])
def test_many_calls_reuse_one_compiled_kernel(schedule):
    res = spawn("tests.gpu.gpu_workers:many_calls", 2, backend="iris", heap_bytes=1 << 26, timeout=600,
                args=(schedule,))
    for errs, compiled in res:
        assert max(errs) < TOL["bf16"], errs
        assert set(compiled.values()) == {1}, compiled  # the epoch (1, 2, .., 16, ..) is not specialized on


@pytest.mark.world(2)
@pytest.mark.parametrize("schedule", ["fused-pull", "fused-push"])
def test_ag_gemm_captured_as_cuda_graph(schedule):
    """Captured calls on 2 ranks: fused-pull reads the peers' A inside the kernel (its replays end with the exit
    barrier), fused-push pushes tiles and waits on flags; every replay on new inputs is right."""
    res = spawn("tests.gpu.gpu_workers:captured_ag_gemm", 2, backend="iris", heap_bytes=1 << 26, timeout=600,
                args=(schedule,))
    assert all(len(errs) == 4 and max(errs) < TOL["bf16"] for errs in res), res
