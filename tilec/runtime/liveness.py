"""Is a peer process still able to make progress? Host-side waits use this to fail in seconds, naming the rank,
when a peer was killed or stopped, instead of waiting out their whole timeout.

A process counts as gone when it no longer exists or is a zombie, and as stopped when /proc says 'T' (SIGSTOP,
SIGTSTP) for longer than STOP_GRACE_S: a job-control stop of the whole process group stops the watcher too, and
a debugger's stop is 't' (traced), which is left alone.
"""

from __future__ import annotations

import os
import time

from tilec import settings

from .errors import PeerLost

# seconds a peer may stay stopped before it counts as lost (TILEC_STOP_GRACE overrides)
STOP_GRACE_S = settings.value("TILEC_STOP_GRACE")
CHECK_EVERY_S = 0.2  # how often a waiting process looks at its peers' state


def proc_state(pid: int) -> str | None:
    """The process's state letter (R, S, D, T, t, Z, ...), or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        return stat[stat.rindex(")") + 2]  # the command name in parentheses may contain spaces or ')'
    except FileNotFoundError:
        return None
    except (OSError, ValueError, IndexError):  # no procfs (not Linux): existence is all we can tell
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "R"


def is_gone(pid: int) -> bool:
    """The process has exited (a zombie waiting to be reaped counts as exited)."""
    return proc_state(pid) in (None, "Z", "X")


class PeerWatch:
    """Tracks the state of some peer processes ({name: pid}) across polls of one wait."""

    def __init__(self, pids: dict, grace: float | None = None):
        self.pids = dict(pids)
        self.grace = STOP_GRACE_S if grace is None else grace
        self._stopped_since: dict = {}
        self._next = 0.0

    def lost(self, force: bool = False) -> tuple | None:
        """(name, pid, why) of the first peer that died or has been stopped longer than the grace, else None.
        Looks at /proc at most every CHECK_EVERY_S unless force."""
        now = time.monotonic()
        if not force and now < self._next:
            return None
        self._next = now + CHECK_EVERY_S
        for name, pid in self.pids.items():
            state = proc_state(pid)
            if state in (None, "Z", "X"):
                return name, pid, "died (its process is gone)"
            if state == "T":
                since = self._stopped_since.setdefault(name, now)
                if now - since >= self.grace:
                    return name, pid, f"is stopped (SIGSTOP?) for {now - since:.1f} s"
            else:
                self._stopped_since.pop(name, None)
        return None


BARRIER_TIMEOUT_S = 300.0  # a host barrier's wall-clock limit when the heap is not given one


def wait_work(work, rank: int, what: str, timeout: float, peers: dict[int, int] | None) -> None:
    """Wait for an async torch.distributed op, giving up with PeerLost when a peer rank ({rank: pid}) dies or stays
    stopped, or when `timeout` wall-clock seconds pass (gloo itself would only give up at the group's timeout, and
    not at all while a peer is merely stopped)."""
    watch = PeerWatch(peers or {})
    t0 = time.monotonic()
    nap = 0.0
    while not work.is_completed():
        lost = watch.lost()
        if lost:
            peer, pid, why = lost
            raise PeerLost(rank, peer, f"rank {rank}: {what}: rank {peer} (pid {pid}) {why}")
        if time.monotonic() - t0 > timeout:
            raise PeerLost(rank, None, f"rank {rank}: {what} did not complete within {timeout:g} s (a peer rank never"
                           " reached it)")
        time.sleep(nap)
        nap = min(0.005, nap * 2 or 5e-5)  # fast for the common short wait, cheap for a long one
    try:
        work.wait()
    except RuntimeError as e:  # gloo reports a dead peer as a broken connection: name it when we can
        lost = watch.lost(force=True)
        if lost:
            peer, pid, why = lost
            raise PeerLost(rank, peer, f"rank {rank}: {what}: rank {peer} (pid {pid}) {why}") from e
        first = (str(e).splitlines() or [""])[0]
        raise PeerLost(rank, None, f"rank {rank}: {what} failed: {first}") from e
