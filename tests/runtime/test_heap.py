"""Heap semantics in-process (one rank, no process group needed)."""

import glob
import os
import uuid

import pytest
import torch

from tilec.runtime import HeapError, ShmHeap, TilecRuntimeError, active_heap, use_heap
from tilec.runtime.cpu_heap import create_shm_files, shm_round
from tilec.runtime.heap import ALIGN


@pytest.fixture
def heap():
    nbytes = shm_round(4096)
    paths = create_shm_files(1, nbytes, f"{os.getpid()}_{uuid.uuid4().hex[:8]}")
    h = ShmHeap(0, 1, paths, nbytes)
    assert not any(os.path.exists(p) for p in paths)  # unlinked once mapped
    yield h
    h.close()


def test_alloc_aligned_zeroed_and_typed(heap):
    a = heap.alloc((3, 5), torch.float16)
    b = heap.alloc(1, torch.int8)
    c = heap.alloc([2, 2], torch.float64)
    assert a.shape == (3, 5) and a.dtype == torch.float16 and a.is_contiguous()
    assert [heap.offset_of(t) for t in (a, b, c)] == [0, ALIGN, 2 * ALIGN]
    assert torch.count_nonzero(c) == 0
    assert heap.used == 2 * ALIGN + 32
    assert heap.heap_bases().dtype == torch.int64 and heap.heap_bases().shape == (1,)
    assert heap.heap_bases()[0].item() == a.data_ptr()
    assert (heap.backend, heap.interpret, heap.device) == ("cpu", True, torch.device("cpu"))


def test_owns(heap):
    a = heap.alloc(16, torch.float32)
    assert heap.owns(a) and heap.owns(a[4:]) and heap.owns(a.view(4, 4).t())
    assert not heap.owns(torch.zeros(16))
    with pytest.raises(HeapError, match="not in rank 0's heap"):
        heap.offset_of(torch.zeros(2))


def test_peer_view_self_aliases(heap):
    a = heap.alloc((4, 4), torch.int32)
    v = heap.peer_view(a[1:, ::2], 0)
    v.fill_(7)
    assert a[1:, ::2].eq(7).all() and a[0].eq(0).all()


def test_exhaustion_message(heap):
    heap.alloc(100, torch.uint8)
    with pytest.raises(HeapError) as ei:
        heap.alloc((64, 64), torch.float32)
    msg = str(ei.value)
    assert "\n" not in msg
    assert "(64, 64)" in msg and "16384 B" in msg and f"{heap.used} of {heap.capacity} B" in msg
    assert "heap_bytes=" in msg and "--heap-mb" in msg
    assert isinstance(ei.value, TilecRuntimeError)
    heap.alloc(heap.capacity - ALIGN, torch.uint8)  # the failed request consumed nothing


def test_mark_release(heap):
    heap.alloc(10, torch.uint8)
    m = heap.mark()
    x = heap.alloc(10, torch.uint8)
    x.fill_(3)
    heap.release(m)
    y = heap.alloc(10, torch.uint8)
    assert y.data_ptr() == x.data_ptr() and y.eq(0).all()
    with pytest.raises(HeapError):
        heap.release(heap.used + 1)


def test_active_heap_and_close(heap):
    with pytest.raises(TilecRuntimeError, match="no active heap"):
        active_heap()
    with use_heap(heap):
        assert active_heap() is heap
        heap.close()
        with pytest.raises(TilecRuntimeError, match="no active heap"):
            active_heap()
    with pytest.raises(HeapError, match="closed"):
        heap.alloc(1, torch.uint8)
    assert not heap.owns(torch.zeros(1))


def test_create_shm_files_leaves_nothing_on_failure():
    tag = f"{os.getpid()}_{uuid.uuid4().hex[:8]}"
    theirs = f"/dev/shm/tilec_{tag}_r1"
    open(theirs, "wb").close()  # someone else's file where rank 1's must go
    try:
        with pytest.raises(FileExistsError):
            create_shm_files(3, 4096, tag)
        assert glob.glob(f"/dev/shm/tilec_{tag}*") == [theirs]  # rank 0's file was removed, theirs kept
    finally:
        os.unlink(theirs)
