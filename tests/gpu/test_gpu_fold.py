"""GPU: fold-last's shared form (the last arrivals of a group split its consumer tasks, the earlier of them
waiting for the group) runs only where every task has a resident program, which the CPU emulation's one program
never has: a split-K GEMM whose merge tiles are a quarter of the part tiles, on 1 and 2 ranks of the visible GPU(s),
against torch."""

import pytest
import torch

from tests import _workers
from tests._util import make_calls
from tests.test_tail import _splitk
from tilec.runtime import spawn

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@pytest.mark.parametrize("world", [1, 2])
def test_shared_fold_matches_torch(world):
    cases, calls = [], {}
    for sched in ("fused-push", "specialized"):
        # 4 part tasks per output tile (K/BS), 4 merge tasks each (BN / BN2); N = 56: a ragged last column tile
        prog = _splitk(world, sched, K=64, N=56, BN2=4)
        assert ("td.arrive_left(" in prog.source) == (sched == "fused-push"), sched
        calls[sched] = make_calls(prog, 3, seed=11 + world)
        cases.append((sched, prog, calls[sched], ()))
    results = spawn(_workers.run_cases, world, backend="iris", heap_bytes=1 << 24, timeout=300, args=(cases,))
    for sched, ins in calls.items():
        for c, per_rank in enumerate(ins):
            want = torch.cat([d["A"].double() @ d["B"].double() for d in per_rank])
            for r in range(world):
                got = results[r][sched][c]["C"].double().cpu()
                assert torch.allclose(got, want, rtol=1e-3, atol=1e-3), (sched, c, r, (got - want).abs().max())
