"""The same rank functions on the Iris backend (GPU only; ranks share GPUs when there are fewer GPUs)."""

import pytest
import rank_workers
import torch

from tilec.runtime import spawn

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")]


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ring_kernel_on_iris(world):

    tiles = 4
    n = tiles * rank_workers.BLOCK
    res = spawn("rank_kernels:ring", world, backend="iris", heap_bytes=1 << 24, timeout=300, kwargs={"tiles": tiles})
    for r, got in enumerate(res):
        src, peer = (r - 1) % world, (r + 1) % world
        torch.testing.assert_close(got["out"], rank_workers.rank_data(src, n) * 2 + src, rtol=0, atol=0)
        torch.testing.assert_close(got["pulled"], rank_workers.rank_data(peer, n), rtol=0, atol=0)
        assert got["offsets"] == res[0]["offsets"] and got["interpret"] is False


def test_layout_on_iris():
    res = spawn(rank_workers.alloc_layout, 2, backend="iris", heap_bytes=1 << 22, timeout=300)
    for x in res:
        assert x["offsets"] == res[0]["offsets"] and all(o % 256 == 0 for o in x["offsets"])
        assert x["owned"] and not x["foreign"] and x["active"]
        assert x["capacity"] == 1 << 22 and "heap exhausted" in x["exhausted"]


def test_peer_view_unavailable_on_iris():
    with pytest.raises(Exception, match="rank 0: NotImplementedError: peer_view is not available"):
        spawn(rank_workers.peer_view_probe, 1, backend="iris", heap_bytes=1 << 21, timeout=300)
