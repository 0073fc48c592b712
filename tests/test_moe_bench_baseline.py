"""The torch baselines of benchmarks/runs/moe_bench.py (routed rows only, every capacity slot), expert-parallel at
1-3 ranks on the CPU (the heap's shared buffers and barriers standing in for symmetric memory's peer views and
device barrier): every token of every rank matches tilec.moe.reference, also with experts left empty and tokens over
capacity, and twice on the same buffers."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tilec import moe
from tilec.runtime import spawn

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "runs" / "moe_bench.py"


def _bench():
    spec = importlib.util.spec_from_file_location("moe_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rank(heap, t_n, h, f, el, k, cap, skew):
    bench = _bench()
    me, world = heap.rank, heap.world
    g = torch.Generator().manual_seed(7)
    xs = [torch.randn(t_n, h, generator=g).half() for _ in range(world)]
    ws = [tuple((torch.randn(rows, cols, generator=g) / rows ** 0.5).half()
                for rows, cols in ((el * h, f), (el * h, f), (el * f, h))) for _ in range(world)]
    if skew:  # every token's first choice is expert 0 (over capacity), its second the last expert; the rest empty
        ids = [torch.tensor([[0, world * el - 1]] * t_n)[:, :k] for _ in range(world)]
    else:
        ids = [torch.stack([torch.randperm(world * el, generator=g)[:k] for _ in range(t_n)]) for _ in range(world)]
    wts = [torch.rand(t_n, k, generator=g) for _ in range(world)]
    routes = moe.route(ids, wts, el, cap)
    want = moe.reference(xs, [w[0] for w in ws], [w[1] for w in ws], [w[2] for w in ws], ids, wts, el, cap)[me]
    shapes = [(t_n, h), (world * el * cap + el * bench.GROUP_ROWS, h)]
    (xb, x_peers), (_y, ye_peers) = (got := bench._exchange_buffers(heap, shapes, print))[0]
    xb.copy_(xs[me])
    errs = []
    for make in (bench._torch_layer, bench._torch_layer_slots):  # routed rows only, every capacity slot
        layer = make(me, world, x_peers, ye_peers, got[1], *ws[me], routes, el, cap, k)
        errs += [float((layer().float() - want).abs().max()) for _ in range(2)]
    return errs


@pytest.mark.parametrize("world, skew", [(1, False), (2, False), (3, True)])
def test_the_expert_parallel_torch_baseline_matches_the_reference(world, skew):
    errs = spawn(f"{__name__}:_rank", world, args=(12, 32, 16, 2, 2, 8, skew), heap_bytes=1 << 22, timeout=120)
    assert max(max(e) for e in errs) < 2e-2, errs
