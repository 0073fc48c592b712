"""Rank side of tests/test_nvshmem.py: several compiled programs, each called on its inputs, in one spawn."""

from tilec.run_vs_reference import rank_worker


def run_all(heap, cases):
    """cases: [(key, prog, inputs[call][rank])] -> {key: this rank's outputs per call}. Each program's buffers are
    released after it ran, so many programs fit one heap."""
    out = {}
    for key, prog, inputs in cases:
        mark = heap.mark()
        out[key] = rank_worker(heap, prog, [c[heap.rank] for c in inputs])[0]
        heap.release(mark)
    return out
