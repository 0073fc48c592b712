"""Persistent loops that claim their tasks from a counter (claim="on"; the default under MPS, where programs of a
grid are not all resident beside a peer's): on the CPU emulation (one program per persistent kernel, so every task
goes through a claim) the results match torch over three calls on the same buffers (the counter is reset by the
last program of each call: a stale one would skip every task of the next), with one rank started late each call so
the waits on the peer's tiles are exercised."""

from __future__ import annotations

import pytest

from tests import _workers
from tests._util import cat_shards, check_close, compile_example, make_calls
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")


@pytest.mark.parametrize("schedule", ["fused-push", pytest.param("fused-pull", marks=pytest.mark.slow)])
def test_claimed_tasks_match_torch(monkeypatch, schedule):
    monkeypatch.setenv("TILEC_CPU_ADVERSARY", "0.2")
    prog = compile_example(2, schedule, {"M": 128, "N": 64, "K": 64}, claim="on")
    calls = make_calls(prog, 3, seed=5)
    res = spawn(_workers.run_cases, 2, heap_bytes=1 << 24, timeout=600, args=([("c", prog, calls, ())],))
    for i, per_rank in enumerate(calls):
        a = cat_shards(per_rank, "A")
        for r in range(2):
            check_close(res[r]["c"][i]["C"], a @ per_rank[r]["B"].float(), "f16", f"rank {r} call {i + 1}")
