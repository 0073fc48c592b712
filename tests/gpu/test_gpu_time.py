"""tilec.perf.gpu_time.cold_time on the GPU: its flush really evicts L2, and leaves nothing dirty for the timed kernel
to write back (the reason it replaced do_bench's zeroing flush). The timed kernel is a plain streaming read, so
its time follows where its bytes come from."""

import pytest
import torch
import triton
import triton.language as tl

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@triton.jit
def _read(x, out, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    base = tl.program_id(0) * BLOCK * STEPS
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(STEPS):
        acc += tl.load(x + base + i * BLOCK + tl.arange(0, BLOCK))
    tl.store(out + tl.program_id(0), tl.sum(acc))


def _reader(nbytes: int):
    block, steps = 2048, 16
    n = nbytes // 4 // (block * steps) * (block * steps)
    x = torch.ones(n, dtype=torch.float32, device="cuda")
    out = torch.empty(n // (block * steps), dtype=torch.float32, device="cuda")
    _read[(out.numel(),)](x, out, block, steps)
    assert out.sum().item() == n  # the kernel really reads every element
    return lambda: _read[(out.numel(),)](x, out, block, steps)


def _hot_time(fn):
    """Like cold_time, with a GPU sleep (no memory traffic) where cold_time flushes: the host queues the launch
    meanwhile, as there, but L2 keeps what the last launch left."""
    from tilec.perf.gpu_time import event_time

    return event_time(fn, lambda: torch.cuda._sleep(100_000))


def test_cold_time_evicts_what_the_last_launch_left_in_l2():
    from tilec.perf.gpu_time import cold_time

    read = _reader(torch.cuda.get_device_properties(0).L2_cache_size // 2)  # half of L2: hits when hot
    assert cold_time(read) > 1.2 * _hot_time(read)


def test_cold_time_leaves_no_dirty_lines_to_write_back():
    from triton.testing import do_bench

    from tilec.perf.gpu_time import cold_time

    read = _reader(2 * torch.cuda.get_device_properties(0).L2_cache_size)  # evicts all that a flush left
    zeroed = do_bench(read, warmup=5, rep=40, return_mode="median") / 1e3
    assert cold_time(read) < 0.95 * zeroed
