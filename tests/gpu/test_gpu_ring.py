"""GPU: the ring programs of tests/test_ring_programs.py (a forwarded ring all-gather, a ring AG+GEMM, a ring
reduce-scatter, a direct ring, a neighbour exchange, a pipeline send, pairs) under every schedule and transport that
applies, at worlds 1, 2 and 4 on the Iris heap, against torch. Two or four ranks on one GPU run side by side under
MPS (benchmarks/runs/mps_world.sh --spawn W python -m pytest -m gpu tests/gpu/test_gpu_ring.py --world W)."""

import pytest
import torch

from tests.test_ring_programs import _cases
from tilec.runtime import spawn

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_ring_programs_on_gpu(world):
    cases, want, _refused = _cases(world)
    got = spawn("tests._workers:run_cases", world, backend="iris", args=(cases,), heap_bytes=1 << 24, timeout=300)
    bad = []
    for rank, res in enumerate(got):
        for key, calls in res.items():
            for out in calls:
                for tname, ref in want[key][rank].items():
                    val = out[tname].float().cpu()
                    if isinstance(ref, tuple):  # (the elements the program writes, their values)
                        val, ref = val[ref[0]], ref[1]
                    err = (val - ref).abs().max().item() / max(1.0, ref.abs().max().item())
                    if not err < 2e-2:
                        bad.append((rank, key, tname, err))
    assert not bad, bad[:8]
    assert len(cases) >= 20
