"""Errors at run time: bad arguments (ArgumentError, naming the argument), and waits that can never be satisfied
(WaitTimeout naming the rank and flag, within a bounded time, instead of a hang)."""

from __future__ import annotations

import re
import time

import pytest
import torch

from tests import _workers
from tests._util import compile_example, make_calls
from tests.conftest import shm_leftovers
from tilec.errors import ArgumentError, TilecError
from tilec.runtime import RankError, TilecRuntimeError, spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

DIMS = {"M": 64, "N": 32, "K": 32}


@pytest.fixture(scope="module")
def prog1():
    return compile_example(1, "fused-pull", DIMS)


EXPECTED = {
    "wrong shape": "argument 'B': shape [33, 32] but the program declares f16[32, 32] (dims {'M': 64, 'N': 32, "
                   "'K': 32})",
    "wrong dtype": "argument 'B': dtype float32 but the program declares f16",
    "missing": "ag_gemm: missing argument 'B' (in f16[32, 32])",
    "unexpected": "ag_gemm: unexpected argument 'D'; it takes A, B, C",
    "internal buffer": "ag_gemm: unexpected argument 'Ag' (it is an internal buffer); it takes A, B, C",
    "not on heap": "argument 'A': declared symmetric, so it must be allocated on the heap (heap.alloc / "
                   "tilec.runtime.active_heap().alloc)",
    "not a tensor": "argument 'B': expected a torch.Tensor, got list",
    "not contiguous": "argument 'B': must be contiguous",
}


@pytest.mark.slow
def test_argument_errors_in_one_rank(prog1):
    """All the bad argument sets in one 1-rank spawn (each ArgumentError caught there), then a good call."""
    assert set(EXPECTED) == set(_workers.BAD_ARGUMENTS)
    inputs = make_calls(prog1, 1, seed=5)[0][0]
    other = compile_example(2, "fused-pull", DIMS)
    (res,) = spawn(_workers.argument_errors, 1, heap_bytes=1 << 22, timeout=120, args=(prog1, other, inputs))
    for case, text in EXPECTED.items():
        assert res[case] == text, case
    assert res["world"] == "ag_gemm was compiled for world 2, the heap has 1 ranks"
    want = inputs["A"].float() @ inputs["B"].float()
    assert torch.allclose(res["ok"].float(), want, rtol=2e-2, atol=2e-2)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["wrong shape", "wrong dtype", "missing", "unexpected", "not on heap"])
def test_argument_error_reaches_the_launcher(prog1, case):
    """Uncaught in the rank, the ArgumentError comes back as a RankError carrying its text."""
    with pytest.raises(RankError) as info:
        spawn(_workers.argument_error, 1, heap_bytes=1 << 22, timeout=120, args=(prog1, case))
    e = info.value
    assert e.rank == 0 and e.exc_type == "ArgumentError"
    want = EXPECTED[case] if case != "wrong shape" else "argument 'B': shape [33, 32] but the program declares"
    assert str(e).startswith(f"rank 0: ArgumentError: {want}")


def test_only_some_kernels():
    """only= launches just the kernels named (what the decode bench times as bsp's local phase): the skipped GEMM
    leaves C as it was; a whole call after it is right; schedules with flags and bad kernel numbers are refused."""
    bsp = compile_example(1, "bsp", DIMS)
    inputs = make_calls(bsp, 1, seed=9)[0][0]
    (res,) = spawn(_workers.only_kernels, 1, heap_bytes=1 << 22, timeout=120,
                   args=(bsp, compile_example(1, "specialized", DIMS), inputs))  # keeps its flags at world 1
    assert torch.isnan(res["only"]).all()
    want = inputs["A"].float() @ inputs["B"].float()
    assert torch.allclose(res["whole"].float(), want, rtol=2e-2, atol=2e-2)
    assert res["flags"] == "only=(0,): schedule specialized has flags; only= takes a schedule without them (bsp)"
    assert res["range"] == "only=(2,): kernel numbers are 0 to 1 here"


def test_call_outside_a_rank_process(prog1):
    with pytest.raises(TilecRuntimeError, match="no active heap"):
        prog1(A=torch.zeros(64, 32), B=torch.zeros(32, 32), C=torch.zeros(64, 32))
    assert issubclass(ArgumentError, TilecError)  # the CLI prints it without a traceback


# -- waits that can never be satisfied -----------------------------------------------------------------------------


@pytest.mark.slow
def test_skipped_call_ends_in_wait_timeout():
    """fused-push, world 2: rank 1 calls twice, rank 0 once (and only stands in the second entry barrier). In its
    second call rank 1 waits inside the kernel for tiles rank 0 never pushes: a WaitTimeout after ~wait_timeout,
    naming rank 1 and the flag, instead of a hang."""
    # a timeout the first call's waits outlast on 2 loaded cores (the peer's pushes arrive late), short for a test
    prog = compile_example(2, "fused-push", DIMS, wait_timeout=1.0)
    inputs = make_calls(prog, 1, seed=11)[0]
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        spawn(_workers.skip_call, 2, heap_bytes=1 << 22, timeout=120, args=([prog, prog], [1, 2], inputs))
    elapsed = time.monotonic() - t0
    e = info.value
    assert e.rank == 1 and e.exc_type == "WaitTimeout"
    msg = str(e)
    assert msg.startswith("rank 1: WaitTimeout: rank 1 waited on flag Ag.gather[")
    want = r"on rank 1 for ~1(\.0)?s: it reached 1 of 2; stage gather on the producing rank never released it"
    assert re.search(want, msg), msg
    assert elapsed < 60, f"took {elapsed:.1f}s"
    assert shm_leftovers() == []


@pytest.mark.slow
def test_wait_timeout_with_another_program_on_the_peer():
    """Two different compiled program objects: rank 0 runs the fused-push program (it waits on tiles its peer pushes),
    rank 1 a flags program of the same shapes that pulls and never releases rank 0's counters. Rank 0's wait ends
    in a WaitTimeout that names rank 0 and its flag."""
    push = compile_example(2, "fused-push", DIMS, wait_timeout=0.05)
    pull = compile_example(2, "flags", DIMS, wait_timeout=0.05)
    inputs = make_calls(push, 1, seed=12)[0]
    with pytest.raises(RankError) as info:
        spawn(_workers.skip_call, 2, heap_bytes=1 << 22, timeout=120, args=([push, pull], [1, 1], inputs))
    e = info.value
    assert e.rank == 0 and e.exc_type == "WaitTimeout"
    assert str(e).startswith("rank 0: WaitTimeout: rank 0 waited on flag Ag.gather[")
