"""Schedules are pipelines of passes. `lower` (passes/lower.py) always runs first, before the schedule's own passes;
the verifier runs after every pass, lower included.

fused-push and specialized end with fold-last; fold=False (`tilec.compile(..., fold=False)`, `--fold off`)
leaves it out: an A/B switch for measuring the tail."""

from __future__ import annotations

from tilec.errors import ScheduleError

from .base import Pass
from .coarsen_copies import CoarsenCopies
from .fold_last import FoldLast
from .fuse_comm import FuseComm
from .local_in_place import LocalInPlace
from .names import DESCRIPTIONS, PASS_NAMES, SCHEDULES  # noqa: F401 - re-exported
from .persist import Persist
from .replace_barriers import ReplaceBarriers
from .transport import Transport, wants_dma


def pipeline(schedule: str, granularity: str = "auto", comm_share: float = 0.25,
             transport: str = "sm", fold: bool = True) -> list[Pass]:
    """transport (of copy stages, passes/transport.py): sm adds no pass; others add `transport` before persist
    (schedules with flags)."""
    passes = _pipeline(schedule, granularity, comm_share, fold)
    if transport == "sm":
        return passes
    if schedule == "bsp":
        if wants_dma(transport):
            raise ScheduleError("transport=dma needs flags (a copy engine releases per-chunk flags): schedule bsp"
                                " has barriers only")
        return passes
    # copy stages leave the kernels; local-in-place then leaves the copy engines' stages as they are
    at = next(i for i, p in enumerate(passes) if isinstance(p, LocalInPlace | Persist))
    return [*passes[:at], Transport(transport), *passes[at:]]


def _pipeline(schedule: str, granularity: str, comm_share: float, fold: bool) -> list[Pass]:
    folds = [FoldLast()] if fold else []
    if schedule == "bsp":
        return [Persist(merge=False)]
    if schedule == "flags":
        return [ReplaceBarriers(granularity), LocalInPlace(), Persist(merge=False)]
    if schedule == "fused-pull":
        return [FuseComm("pull"), ReplaceBarriers(granularity), Persist(merge=True)]
    if schedule == "fused-push":
        return [FuseComm("push"), ReplaceBarriers(granularity), LocalInPlace(), CoarsenCopies(), Persist(merge=True),
                *folds]
    if schedule == "specialized":
        return [ReplaceBarriers(granularity), LocalInPlace(whole=False),
                Persist(merge=True, specialize=True, comm_share=comm_share), *folds]
    raise ScheduleError(f"unknown schedule '{schedule}' (choose from {', '.join(SCHEDULES)})")


