"""Files tilec writes: user outputs (`compile -o`, `--plot`, bench JSON, machine files, `save()`) and the caches
under cache_dir().

Outputs go only to regular files or new paths (a device, FIFO, socket or directory named as an output is refused,
never replaced) and are written through a temporary file in the same directory and `os.replace`, so a reader
sees the old file or the whole new one, never half of it. Caches are read-modify-write JSON files updated under
an exclusive `flock` on a lock file beside them, so concurrent writers (ranks, parallel runs) lose no record.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from tilec.errors import TilecError

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))


class OutputPathError(TilecError):
    """A path given for tilec to write cannot be written safely (a special file, a missing folder)."""


def output_path(path: str | os.PathLike) -> Path:
    """The regular file `path` names (symlinks followed), checked before anything is computed or written: it
    must be a regular file or not exist yet, in a folder that exists."""
    p = Path(path)
    real = Path(os.path.realpath(p))
    try:
        st = os.stat(real)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise OutputPathError(f"{p}: cannot write here ({e.strerror})") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = next((k for test, k in _KINDS if test(st.st_mode)), "not a regular file")
        raise OutputPathError(f"{p}: is {kind}; tilec writes only regular files or new paths")
    if not real.parent.is_dir():
        raise OutputPathError(f"{p}: folder {real.parent} does not exist")
    return real


def write_atomic(path: str | os.PathLike, data: str | bytes | Callable[[Path], None]) -> Path:
    """Write `data` (text, bytes, or a function that writes a given path) to `path` through a temporary file in
    the same folder and os.replace. A failure leaves `path` as it was and no temporary file behind."""
    real = output_path(path)
    mode = os.stat(real).st_mode & 0o777 if real.exists() else 0o666 & ~_umask()
    try:
        fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=real.suffix or ".tmp")
    except OSError as e:  # a read-only folder or file system, a full disk, a name too long
        raise OutputPathError(f"{path}: cannot write here ({e.strerror})") from None
    try:
        if callable(data):
            os.close(fd)
            fd = -1
            data(Path(tmp))
        else:
            with os.fdopen(fd, "wb") as f:
                fd = -1
                f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except BaseException as e:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(e, OSError) and not isinstance(e, TilecError):
            raise OutputPathError(f"{path}: cannot write here ({e.strerror or e})") from None
        raise
    return real


def _umask() -> int:
    m = os.umask(0o22)
    os.umask(m)
    return m


def ensure_dir(path: str | os.PathLike) -> Path:
    """A folder to write results into (created with its parents); anything else at that path is refused."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputPathError(f"{p}: exists and is not a folder")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputPathError(f"{p}: cannot create the folder ({e.strerror})") from None
    return p


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock for read-modify-write of `path` (flock on `path`.lock; released on exit or death)."""
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def read_json(path: Path) -> dict:
    """A JSON cache's content; {} when it is missing or unreadable (a cache is only ever a hint)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def update_json(path: Path, change: Callable[[dict], object]) -> dict:
    """Apply `change` to the JSON dict at `path` under its lock and replace the file atomically; returns the
    new content. Concurrent updates of one file are serialized, so none is lost."""
    with locked(path):
        data = read_json(path)
        change(data)
        write_atomic(path, json.dumps(data, indent=1, sort_keys=True))
    return data
