"""The decode baseline of ranks sharing one GPU (MPS, where NCCL refuses them): SDPA with lse on each rank, (O, lse)
exchanged through symmetric memory (tilec.perf.bench_baselines._symm_exchange, torch's on a GPU) and combined. On the
CPU the exchange runs over the tilec heap's shared buffers and barriers instead (torch's symmetric memory needs a
GPU), the rest of the step as the bench runs it."""

from __future__ import annotations

import pytest

from tilec.perf import bench_decode, inputs


def _shared_path_on_cpu(heap, dims):
    """Rank side: decode_ops where the ranks share a device, with the heap standing in for symmetric memory."""
    import torch

    from tilec.perf import bench_baselines

    def heap_exchange(heap, numel, log):
        buf = heap.alloc((numel,), torch.float32)
        return buf, [heap.peer_view(buf, r) for r in range(heap.world)], heap.barrier

    bench_baselines._symm_exchange = heap_exchange
    q, k, v, lens = inputs.make_inputs(dims, heap.world, heap.rank, "f32", heap.device)
    ops = bench_baselines.decode_ops(heap, dims, heap.world, q, k, v, lens, "bshd", 2, lambda *_: None)
    ref = bench_decode.reference_output(dims, heap.world, "f32", heap.device)
    return [(op.name, op.kind, [bench_decode.rel_err(op.fn(), ref) for _ in range(2)]) for op in ops]


@pytest.mark.slow  # a multi-rank run of several seconds, like the NCCL path's test in test_bench_cpu.py
def test_the_shared_gpu_baseline_exchanges_through_shared_buffers():
    from tilec.runtime import spawn

    dims = dict(B=2, HKV=2, G=4, D=32, S=48)
    for rows in spawn(f"{__name__}:_shared_path_on_cpu", 2, args=(dims,), heap_bytes=1 << 20, timeout=120):
        names = {name: (kind, errs) for name, kind, errs in rows}
        assert set(names) == {"torch attention (local, no comm)", "torch attention+symm_mem"}
        kind, errs = names["torch attention+symm_mem"]
        assert kind == "reference" and max(errs) < 1e-5  # the whole op, twice on the same buffers
        assert min(names["torch attention (local, no comm)"][1]) > 1e-2  # one rank's block alone is not
