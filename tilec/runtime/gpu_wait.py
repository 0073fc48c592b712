"""Waiting for this process's queued GPU work with a limit. torch.cuda.synchronize waits forever: every flag wait of
tilec's stops after wait_timeout, but a kernel stuck elsewhere (in a library call it makes, such as NVSHMEM's) would
hang its rank with it, and its peers at their next barrier."""

from __future__ import annotations

import time

SPIN_S = 0.005  # polled back to back at first (a short call ends within it), then every POLL_S: at most 2% late
POLL_S = 1e-4
SLACK_S = 10.0  # beyond the waits: the work itself, and a loaded host


def stuck_after(wait_timeout: float, kernels: int) -> float:
    """Seconds after which a call's kernels still running are stuck outside tilec's waits: each of its kernels may
    spend up to one wait_timeout waiting (once a wait has timed out the call's others stop at once), plus slack for
    the work itself."""
    return (kernels + 1) * wait_timeout + SLACK_S


def finish_queued(device, limit_s: float) -> bool:
    """Wait until the work queued on `device`'s current stream (with the streams joined into it) has finished, for
    at most limit_s seconds, then for the rest of the device's queued work; False when it had not finished by then
    (the work is left running)."""
    import torch

    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(device))
    t0 = time.monotonic()
    while not done.query():
        waited = time.monotonic() - t0
        if waited > limit_s:
            return False
        if waited > SPIN_S:
            time.sleep(POLL_S)
    torch.cuda.synchronize(device)
    return True
