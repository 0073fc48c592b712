"""Is a peer process still able to make progress? Host-side waits use this to fail in seconds, naming the rank,
when a peer was killed or stopped, instead of waiting out their whole timeout.

A process counts as gone when it no longer exists or is a zombie, and as stopped when /proc says 'T' (SIGSTOP,
SIGTSTP) for longer than STOP_GRACE_S: a job-control stop of the whole process group stops the watcher too, and
a debugger's stop is 't' (traced), which is left alone.
"""

from __future__ import annotations

import os
import time

# seconds a peer may stay stopped before it counts as lost (TILEC_STOP_GRACE overrides)
STOP_GRACE_S = float(os.environ.get("TILEC_STOP_GRACE", "3"))
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
