"""Schedules are pipelines of passes. `lower` always runs first; the verifier runs after every pass.

fused-push and specialized end with fold-last; TILEC_FOLD=0 in the environment leaves it out (an A/B switch for
measuring the tail, e.g. `TILEC_FOLD=0 tilec bench ...`)."""

from __future__ import annotations

import os

from tilec.errors import ScheduleError

from .base import Pass
from .fold_last import FoldLast
from .fuse_comm import FuseComm
from .persist import Persist
from .replace_barriers import ReplaceBarriers

SCHEDULES = ("bsp", "flags", "fused-pull", "fused-push", "specialized")

DESCRIPTIONS = {
    "bsp": "one kernel per stage, a global barrier where the program has one (the baseline)",
    "flags": "one persistent kernel per stage on its own stream, per-tile flags instead of barriers",
    "fused-pull": "consumers read the copy's source from peers directly; the buffer and its stage disappear",
    "fused-push": "owners store tiles into peers and release their flags; one persistent kernel",
    "specialized": "one persistent kernel, each stage on programs of its own (communication vs compute), flags",
}


def pipeline(schedule: str, granularity: str = "auto", comm_share: float = 0.25) -> list[Pass]:
    fold = [FoldLast()] if os.environ.get("TILEC_FOLD", "1") != "0" else []
    if schedule == "bsp":
        return [Persist(merge=False)]
    if schedule == "flags":
        return [ReplaceBarriers(granularity), Persist(merge=False)]
    if schedule == "fused-pull":
        return [FuseComm("pull"), ReplaceBarriers(granularity), Persist(merge=True)]
    if schedule == "fused-push":
        return [FuseComm("push"), ReplaceBarriers(granularity), Persist(merge=True), *fold]
    if schedule == "specialized":
        return [ReplaceBarriers(granularity), Persist(merge=True, specialize=True, comm_share=comm_share),
                *fold]
    raise ScheduleError(f"unknown schedule '{schedule}' (choose from {', '.join(SCHEDULES)})")


PASS_NAMES = ("lower", "fuse-comm", "replace-barriers", "persist", "fold-last", "codegen")
