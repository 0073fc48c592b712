"""tilec runtime: symmetric heaps (CPU emulation over /dev/shm, Iris on GPUs) and the rank launcher.

Importing this package loads torch only; triton and iris are imported inside the functions that
need them, so a launcher process stays light and can still set TRITON_INTERPRET for its ranks.
"""

from .context import active_heap, use_heap
from .cpu_heap import ShmHeap
from .errors import HeapError, KernelsStuck, LaunchTimeout, PeerLost, RankError, TilecRuntimeError
from .heap import Heap
from .iris_heap import IrisHeap
from .launcher import default_backend, from_env, from_process_group, spawn, under_torchrun

__all__ = [
    "Heap",
    "ShmHeap",
    "IrisHeap",
    "spawn",
    "from_env",
    "from_process_group",
    "active_heap",
    "use_heap",
    "default_backend",
    "under_torchrun",
    "HeapError",
    "RankError",
    "LaunchTimeout",
    "KernelsStuck",
    "PeerLost",
    "TilecRuntimeError",
]
