"""Flag waits time out after wall-clock seconds (tilec.compile(wait_timeout=...), --wait-timeout), not after a
count of spins: on the CPU emulation a wait that can never be satisfied becomes a WaitTimeout within about the
timeout, and a call with many waiting tasks still ends after one timeout, not one per task."""

from __future__ import annotations

import time

import pytest

from tests._util import compile_example, make_calls
from tests._workers import _alloc_args
from tilec.errors import ArgumentError
from tilec.program import DEFAULT_WAIT_TIMEOUT, WaitTimeout, wait_timeout_seconds
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

# 8 gemm tasks per rank (4 row tiles x 2 column tiles) wait on rows rank 0 never pushes: one timeout each would
# take 8 timeouts
DIMS = {"M": 128, "N": 64, "K": 32, "BM": 32, "BN": 32, "BK": 32}
TIMEOUT = 2.0


def late_call(heap, prog, inputs):
    """Both ranks call once; then rank 1 calls again while rank 0 only stands in its entry barrier, so rank 1's
    tasks wait for tiles rank 0 never pushes. Rank 1 returns how long its second call took and what it raised."""
    args = _alloc_args(heap, prog)
    for name, t in inputs[heap.rank].items():
        args[name].copy_(t)
    prog(**args)
    if heap.rank == 0:
        heap.barrier()
        return None
    t0 = time.monotonic()
    try:
        prog(**args)
    except WaitTimeout as e:
        return time.monotonic() - t0, str(e)
    return time.monotonic() - t0, None


@pytest.mark.slow
def test_unsatisfiable_wait_ends_after_the_timeout_in_seconds():
    prog = compile_example(2, "fused-push", DIMS, wait_timeout=TIMEOUT)
    # the pushes of rank 0 are missing: every gemm task of rank 1 reading them waits
    inputs = make_calls(prog, 1, seed=5)[0]
    _, (elapsed, msg) = spawn(late_call, 2, heap_bytes=1 << 22, timeout=240, args=(prog, inputs))
    print(f"the failing call took {elapsed:.1f}s")
    assert msg is not None and "Ag.gather" in msg, msg
    # at least the timeout (a wall-clock wait, not a spin budget that a slow interpreter stretches or shrinks), and
    # not one timeout per waiting task: the interpreter runs the call's other tasks in a few seconds besides
    assert TIMEOUT <= elapsed < TIMEOUT + 10, f"the failing call took {elapsed:.1f}s"


def test_timeout_default_override_and_bad_values(monkeypatch):
    assert wait_timeout_seconds(None) == DEFAULT_WAIT_TIMEOUT == 60.0
    assert wait_timeout_seconds(0.5) == 0.5
    monkeypatch.setenv("TILEC_WAIT_TIMEOUT", "7.5")  # a compile option, not an environment variable
    assert wait_timeout_seconds(None) == DEFAULT_WAIT_TIMEOUT
    for bad in (0, -1, float("inf"), float("nan"), "5", True):
        with pytest.raises(ArgumentError, match=r"^wait_timeout="):
            wait_timeout_seconds(bad)


def test_compiled_program_carries_the_timeout():
    assert compile_example(1, "bsp", DIMS).wait_timeout == DEFAULT_WAIT_TIMEOUT
    prog = compile_example(1, "bsp", DIMS, wait_timeout=1.5)
    assert prog.wait_timeout == 1.5 and "wait_timeout=1.5" in prog.source  # in the header: ranks run what it says
