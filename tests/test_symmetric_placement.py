"""Symmetric arguments at the same heap offset on every rank, or an ArgumentError on every rank.

Peers read and write a symmetric tensor at the offset it has in their own heap (heap bases differ, offsets must
not). A call's entry barrier carries a digest of where this rank's symmetric arguments and the program's internal
buffers lie (CompiledProgram._enter); ranks that disagree exchange the offsets and every rank raises naming the
argument, the offsets and the ranks, before the call's epoch moves on."""

from __future__ import annotations

import pytest

from tests import _placement_workers
from tests._util import compile_example, make_calls, rel_err
from tests.test_dma import _ag_rows
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

DIMS = {"M": 48, "N": 16, "K": 16, "BM": 16, "BN": 16, "BK": 16}


def test_symmetric_arguments_at_other_offsets_are_refused_on_every_rank():
    """World 3, flags (peers read A, flags carry epochs) and bsp: A shifted on rank 1 is refused on all three ranks
    with its offsets; the same call with A placed alike then runs right, twice (the refused call left the flags'
    epochs in step); a program whose internal buffers differ (rank 2 allocated more before its first call) is
    refused too."""
    world = 3
    prog, fresh = compile_example(world, "flags", DIMS, wait_timeout=20.0), compile_example(world, "bsp", DIMS)
    inputs = make_calls(prog, 1, seed=11)[0]
    res = spawn(_placement_workers.placements, world, heap_bytes=1 << 22, timeout=300, args=(prog, fresh, inputs))
    for r in range(world):
        shifted = res[r]["shifted"]
        assert isinstance(shifted, str), f"rank {r} ran the call with A at another offset on rank 1"
        assert "argument 'A': declared symmetric" in shifted and "on rank 1" in shifted and "on ranks 0, 2" in shifted
        for key in ("fixed", "again"):
            got = res[r][key]
            assert not isinstance(got, str), got
            assert rel_err(got, _ag_rows(inputs, r)["C"]) < 2e-2, (r, key)
        internal = res[r]["internal"]
        assert isinstance(internal, str) and "internal buffers" in internal and "on rank 2" in internal, internal
