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


@pytest.mark.world(2)
def test_a_timed_out_op_call_is_raised_not_lost():
    """Two ranks sharing the GPU; the second skips one call. The first rank's call returns at once (asynchronous),
    and the timeout of its device barrier is raised by the op's next call or by check_errors(), within seconds."""
    timeout = 2.0
    res = spawn("tests._ops_workers:late_peer_gpu", 2, backend="iris", args=({"shape": (64, 32, 32),
                "timeout": timeout},), heap_bytes=1 << 26, timeout=300)
    for how in ("next call", "check_errors"):
        r = res[0][how]
        assert r["first"] < 1e-2 and res[1][how]["first"] < 1e-2, res
        assert r["returned_s"] < timeout, r
        msg, flag, after = r["raised"]
        assert flag == "barrier" and "device barrier" in msg and "of 2 ranks arrived" in msg, msg
        assert after < timeout + 10, r
        assert res[1][how]["raised"] is None
