"""The process's active heap: compiled programs pick it up when no heap is passed explicitly.

A plain module global, not a ContextVar: one rank process owns one heap, and threads it starts
(e.g. a benchmark loop) should see it too.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .errors import TilecRuntimeError

if TYPE_CHECKING:
    from .heap import Heap

_active: Heap | None = None


def active_heap() -> Heap:
    """The heap set by `use_heap` (spawn sets it in every rank) or by `from_env`."""
    if _active is None or _active.closed:
        raise TilecRuntimeError(
            "no active heap: run inside tilec.runtime.spawn(...), call tilec.runtime.from_env() under torchrun, "
            "or enter `with use_heap(heap):`"
        )
    return _active


@contextmanager
def use_heap(heap: Heap) -> Iterator[Heap]:
    """Make `heap` the active heap inside the block; the previous one is restored on exit."""
    global _active
    prev, _active = _active, heap
    try:
        yield heap
    finally:
        _active = prev


def _install(heap: Heap) -> None:
    """Make `heap` active for the rest of the process (from_env)."""
    global _active
    _active = heap
