"""Runtime errors. Messages are one line; long detail (child tracebacks) lives in attributes."""

from __future__ import annotations

from tilec.errors import TilecError


class TilecRuntimeError(TilecError, RuntimeError):
    """Base class of every error the tilec runtime raises on purpose (a TilecError: the CLI prints it
    without a traceback)."""


class HeapError(TilecRuntimeError):
    """The symmetric heap cannot satisfy a request (exhausted, closed, foreign tensor)."""


class RankError(TilecRuntimeError):
    """A rank process raised, or died without reporting.

    `details` holds the child's formatted traceback (or a note on how it died); `exc_type` the
    name of the exception class when there was one; `exitcode` the process exit code when it died.
    """

    def __init__(
        self, rank: int, text: str, *, details: str = "", exc_type: str | None = None, exitcode: int | None = None
    ):
        super().__init__(f"rank {rank}: {text}")
        self.rank = rank
        self.text = text
        self.details = details
        self.exc_type = exc_type
        self.exitcode = exitcode

    def __reduce__(self):
        kw = {"details": self.details, "exc_type": self.exc_type, "exitcode": self.exitcode}
        return _rebuild_rank_error, (self.rank, self.text, kw)


class LaunchTimeout(TilecRuntimeError):
    """Some ranks had not finished when the launch timeout expired; all ranks were terminated."""

    def __init__(self, ranks: list[int], timeout: float):
        names = ", ".join(str(r) for r in ranks)
        super().__init__(f"launch timed out after {timeout:g} s; ranks still running: {names} (all ranks terminated; "
                         "their Python stacks are on stderr above)")
        self.ranks = list(ranks)
        self.timeout = timeout

    def __reduce__(self):
        return LaunchTimeout, (self.ranks, self.timeout)


class PeerLost(TilecRuntimeError):
    """A host-side wait (barrier, heap set-up) gave up because a peer rank died, was stopped, or never came:
    `peer` is that rank (None when it could not be told), `rank` the one that waited."""

    def __init__(self, rank: int, peer: int | None, text: str):
        super().__init__(text)
        self.rank = rank
        self.peer = peer

    def __reduce__(self):
        return PeerLost, (self.rank, self.peer, str(self))


class KernelsStuck(TilecRuntimeError):
    """A call's kernels had not finished long after every flag wait of theirs would have timed out: they are stuck
    outside tilec's waits (runtime/gpu_wait.py). `rank` is the rank whose kernels they are, `seconds` the wait."""

    def __init__(self, rank: int, seconds: float, text: str):
        super().__init__(text)
        self.rank = rank
        self.seconds = seconds

    def __reduce__(self):
        return KernelsStuck, (self.rank, self.seconds, str(self))


def _rebuild_rank_error(rank, text, kw):
    return RankError(rank, text, **kw)
