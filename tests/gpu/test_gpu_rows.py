"""GPU: data-dependent rows (tests/test_rows.py's programs) through Iris: a gather and a scatter whose bad index or
repeated row raises IndexRangeError from the device's error word, then runs right again; the MoE example at 1, 2 and 4
ranks, every schedule that applies."""

import re

import pytest
import torch

import tilec
from tests.test_rows import GATHER, SCATTER, _compile, _moe_case
from tilec.errors import ScheduleError
from tilec.runtime import spawn

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


def test_gather_and_scatter_errors_on_gpu():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(37, 24, generator=g).half()
    good = torch.randint(0, 37, (40,), generator=g, dtype=torch.int32)
    bad = good.clone()
    bad[37] = 812
    x4 = torch.randn(40, 24, generator=g).half()
    perm = torch.randperm(45, generator=g)[:40].to(torch.int32)
    twice = perm.clone()
    twice[33] = perm[5]
    cases = [("gather", _compile(GATHER), [[{"X": x, "idx": good}], [{"X": x, "idx": bad}], [{"X": x, "idx": good}]]),
             ("scatter", _compile(SCATTER, schedule="flags"),
              [[{"X": x4, "idx": perm}], [{"X": x4, "idx": twice}], [{"X": x4, "idx": perm}]])]
    (got,) = spawn("tests._rows_workers:calls_or_errors", 1, backend="iris", args=(cases,), heap_bytes=1 << 26,
                   timeout=600)
    first, err, again = got["gather"]
    assert torch.equal(first["Y"].float().cpu(), x.float()[good.long()] * 2) and torch.equal(again["Y"], first["Y"])
    assert "index out of range: idx[37] = 812 is not a row of dim 0 of 'X' (0..36)" in err, err
    first, err, again = got["scatter"]
    want = (x4.float() * 2).half().float()
    assert torch.equal(first["Y"].float().cpu()[perm.long()], want)
    assert torch.equal(again["Y"].float().cpu()[perm.long()], want)
    # which of the two elements naming one row stores first is up to the GPU: the message names the other one
    assert re.search(rf"rows not distinct: idx\[(5|33)\] = {int(perm[5])} ", err), err


@pytest.mark.parametrize("world", [1, 2, 4])
def test_moe_on_gpu(world):
    cases, want = [], {}
    for i, (k, route) in enumerate([(2, "any"), (1, "one")]):
        inputs, ref, _ = _moe_case(world, 24, 2, 16, k, route, seed=20 + i)
        for sched in ("bsp", "flags", "specialized", "fused-push"):
            try:
                prog = tilec.compile("examples/moe.tile", world=world, schedule=sched, dims={"T": 24, "K": k})
            except ScheduleError:
                continue
            cases.append(((sched, k, route), prog, [inputs, inputs]))
            want[(sched, k, route)] = ref
    got = spawn("tests._rows_workers:calls_or_errors", world, backend="iris", args=(cases,), heap_bytes=1 << 26,
                timeout=600)
    for rank, res in enumerate(got):
        for key, outs in res.items():
            for out in outs:
                o, w = out["O"].float().cpu(), want[key][rank]
                assert float((o - w).abs().max()) / max(1.0, float(w.abs().max())) < 2e-2, (rank, key)
