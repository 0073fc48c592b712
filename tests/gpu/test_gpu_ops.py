"""GPU: tilec ops recorded in CUDA graphs (torch.cuda.graph and torch.compile's cudagraphs), with device barriers."""

import math

import pytest
import torch

from tilec.runtime import spawn

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@pytest.mark.parametrize("world", [1, 2])
def test_ops_inside_cuda_graphs(world):
    cases = {"shape": (256 * world, 128, 256), "replays": 4}
    res = spawn("tests._ops_workers:captured_ops", world, backend="iris", args=(cases,), heap_bytes=1 << 26,
                timeout=600)
    for rank, r in enumerate(res):
        errs = [r["eager"], *r["graph"], *r["compiled"]]
        assert len(r["graph"]) == 6 and all(math.isfinite(e) and e < 3e-2 for e in errs), (rank, r)
        assert "schedule bsp has host barriers" in r["refused"]["bsp"], r["refused"]
        assert "call the op once with them before capturing" in r["refused"]["new shape"], r["refused"]
