"""Rank functions for the fault tests (test_faults.py): torch only, so ranks start fast."""

import os
import time


def _record_pid(heap, pid_dir: str) -> None:
    tmp = os.path.join(pid_dir, f".{heap.rank}.tmp")
    with open(tmp, "w") as f:
        f.write(str(os.getpid()))
    os.replace(tmp, os.path.join(pid_dir, f"{heap.rank}.pid"))  # whole or absent: the test polls for it


def barriers(heap, pid_dir: str, seconds: float):
    """Record this rank's pid, then cross-rank barriers for `seconds` (a fault is injected from outside)."""
    _record_pid(heap, pid_dir)
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        heap.barrier()
        n += 1
        time.sleep(0.01)
    return n


def sleep_then_return(heap, seconds: float):
    time.sleep(seconds)
    return heap.rank
