"""CPU emulation of the symmetric heap: one /dev/shm file per rank, mapped by every rank.

Under TRITON_INTERPRET=1 Triton kernels dereference raw host addresses, so once each rank process
maps every rank's file, `heap_bases` (the mapped addresses) lets the unmodified Iris device calls
(load/store/atomics, release/acquire flags) reach peers exactly as on a GPU.
"""

from __future__ import annotations

import mmap
import os
import re
import stat

import torch

from .errors import HeapError, TilecRuntimeError
from .heap import ALIGN, Heap
from .liveness import BARRIER_TIMEOUT_S, is_gone

SHM_DIR = "/dev/shm"
SHM_PREFIX = "tilec_"
# spawn()'s heap files: tilec_<launcher pid>_<8 hex>_r<rank> (the pid says whose they are once the launcher is gone)
_SPAWN_FILE = re.compile(rf"^{SHM_PREFIX}(\d+)_[0-9a-f]{{8}}_r\d+$")


def shm_round(nbytes: int) -> int:
    """Heap files are whole pages (mmap) and whole ALIGN blocks (typed peer views)."""
    page = max(mmap.PAGESIZE, ALIGN)
    return max(page, (nbytes + page - 1) // page * page)


def create_shm_files(world: int, nbytes: int, tag: str) -> list[str]:
    """Create `world` zero-filled (sparse) heap files; on failure none is left behind."""
    paths: list[str] = []
    try:
        for r in range(world):
            path = os.path.join(SHM_DIR, f"{SHM_PREFIX}{tag}_r{r}")
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            paths.append(path)
            try:
                os.ftruncate(fd, nbytes)
            finally:
                os.close(fd)
    except BaseException:
        unlink_quietly(paths)
        raise
    return paths


def unlink_quietly(paths: list[str]) -> None:
    for p in paths:
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass


def remove_stale(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink spawn() heap files whose launcher has exited (one killed during start-up could not remove them).
    Only this user's regular files named exactly like spawn's, and only when the pid in the name is gone."""
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    removed = []
    for name in names:
        m = _SPAWN_FILE.match(name)
        if not m or int(m.group(1)) == os.getpid() or not is_gone(int(m.group(1))):
            continue
        path = os.path.join(shm_dir, name)
        try:
            st = os.lstat(path)
            if st.st_uid != os.getuid() or not stat.S_ISREG(st.st_mode):
                continue
            os.unlink(path)
        except OSError:
            continue  # another process removed it first, or it is not ours to remove
        removed.append(path)
    return removed


class ShmHeap(Heap):
    """Rank `rank`'s heap over the shared-memory files `paths` (one per rank, `nbytes` each).

    The barrier uses the default torch.distributed process group (gloo), which must exist when
    world > 1. With unlink=True the files are removed once every rank has mapped them, so a crash
    later cannot leak them (the mappings stay valid). Every barrier gives up after `timeout` seconds, and within
    seconds when a peer rank's process dies or is stopped (PeerLost naming it): the first one exchanges pids.
    """

    backend = "cpu"
    interpret = True
    _destroy_group_on_close = False  # from_env (torchrun) sets it when it made the process group

    def __init__(self, rank: int, world: int, paths: list[str], nbytes: int, *, unlink: bool = True,
                 timeout: float = BARRIER_TIMEOUT_S, group=None):
        if len(paths) != world:
            raise TilecRuntimeError(f"ShmHeap needs one file per rank: {len(paths)} files for world {world}")
        if nbytes % ALIGN:
            raise TilecRuntimeError(f"ShmHeap size {nbytes} is not a multiple of {ALIGN}")
        self.timeout = timeout
        self.group = group  # barriers run over this torch.distributed group (None: the default group)
        self._maps: list[mmap.mmap] = []
        for p in paths:
            fd = os.open(p, os.O_RDWR)
            try:
                if os.fstat(fd).st_size < nbytes:
                    raise HeapError(f"heap file {p} is smaller than {nbytes} B")
                self._maps.append(mmap.mmap(fd, nbytes))
            finally:
                os.close(fd)  # the mapping keeps the file alive
        self._views = [torch.frombuffer(m, dtype=torch.uint8) for m in self._maps]
        super().__init__(rank, world, torch.device("cpu"), self._views[rank])
        self._bases = torch.tensor([v.data_ptr() for v in self._views], dtype=torch.int64)
        if unlink:
            self.barrier()  # every rank has mapped every file
            unlink_quietly([paths[rank]])

    def heap_bases(self) -> torch.Tensor:
        self._check_open()
        return self._bases

    def barrier(self, tag: int | None = None) -> list[int | None]:
        self._check_open()
        return self.host_barrier(tag)

    def peer_view(self, t: torch.Tensor, rank: int) -> torch.Tensor:
        off = self.offset_of(t)
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} out of range for world {self.world}")
        elems = self._views[rank].view(t.dtype)  # offsets are ALIGN-aligned, so off is a whole number of elements
        return elems.as_strided(t.shape, t.stride(), off // t.element_size())

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        self._views = []
        self._bases = None
        for m in self._maps:
            try:
                m.close()
            except BufferError:
                pass  # a caller still holds a tensor over it; the OS unmaps at exit
        self._maps = []
        if self._destroy_group_on_close:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
