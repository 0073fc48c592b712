"""The record of one tile-library function: everything the compiler needs to know about it in one place."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Shape = tuple[int, ...]


@dataclass(frozen=True)
class TileFn:
    """A builtin with several results (`O[...], L[...] = attend(q, k, v, n)`).

    check(shapes, args) -> the results' (dtype, shape), or a message saying why these arguments do not fit
        (sema puts the statement's location in front). `shapes` are the arguments' logical shapes (ir.types.
        logical_shape), `args` the typed argument expressions.
    reference(*tiles) -> the results as torch tensors (the reference interpreter; f32).
    emit(em, call, args, results) -> the kernel-IR statement computing the results (built with em.kb, the emitter's
        constructors: codegen/build.py, which this layer does not import), given the emitter (for the true extents
        of padded tiles: em.rows_valid / em.key_count / em.extent_of_last), the TupleCall, the arguments' values
        (kernel-IR expressions) and the results' names. It calls the device functions named in `device`
        (tilec.device, as td.NAME).
    moves_data: a stage built on it is data movement rather than compute (persist(specialize) gives it the
        communication programs).
    """

    name: str
    signature: str
    results: int
    check: Callable[[list[Shape], tuple], tuple[tuple[str, Shape], ...] | str]
    reference: Callable[..., tuple]
    emit: Callable[[object, object, list, tuple[str, ...]], object]
    device: tuple[str, ...]
    moves_data: bool = False
