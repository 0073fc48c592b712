"""Start one process per rank, give each a symmetric heap, run a function, collect the results.

`spawn` is the single-host launcher (CPU emulation or several ranks on local GPUs); `from_env`
builds the heap of a process started by torchrun.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import wait as _wait  # module attribute: tests patch it
from typing import Any

from .context import _install, use_heap
from .cpu_heap import create_shm_files, remove_stale, shm_round, unlink_quietly
from .errors import LaunchTimeout, RankError, TilecRuntimeError
from .liveness import PeerWatch, is_gone, proc_state

BACKENDS = ("cpu", "iris", "nvshmem")
_CLEANUP_GRACE_S = 10.0  # how long ranks that reported may take to tear down before being killed
_TERM_GRACE_S = 3.0  # SIGTERM -> SIGKILL
_POLL_S = 0.2  # how often the launcher and the ranks look at each other's state
_EXIT_ORPHANED = 75  # a rank's exit code when it gave up on a launcher that died or stayed stopped
_TMP_PREFIX = "tilec-"  # spawn's temporary folder: tilec-<launcher pid>_<8 hex>-<random>
START_METHODS = ("spawn", "forkserver")
# what spawn(start_method=None) uses: "spawn" (a fresh interpreter per rank) or "forkserver" (ranks fork from one
# server process that imported torch once: ~2 s less CPU per rank; a test suite with many launches sets it)
start_method = "spawn"


def default_backend() -> str:
    """ "iris" when a CUDA or ROCm GPU is visible, else "cpu"."""
    import torch

    return "iris" if torch.cuda.is_available() else "cpu"


def _resolve_backend(backend: str | None) -> str:
    if backend in (None, "auto"):
        return default_backend()
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS} or 'auto'")
    return backend


# -- rank process side ---------------------------------------------------------------------------


@dataclass
class _RankSpec:
    world: int
    backend: str
    heap_bytes: int
    timeout: float
    store_path: str
    shm_paths: list[str] = field(default_factory=list)
    # pickled (fn, args, kwargs) in a file, not in the Process args: CPython writes those through a pipe
    # whose read end the parent holds until the write ends, so a big payload to a child that dies
    # while bootstrapping blocks the parent forever; and ranks would start one after another
    call_path: str = ""
    launcher_pid: int = 0  # the rank exits (after removing the files above) once this process is gone or stopped
    tmpdir: str = ""
    env: dict | None = None  # the launcher's environment at spawn(): a forked rank inherits its server's instead


def _rank_main(spec: _RankSpec, rank: int, conn) -> None:
    """Entry point of a rank process. Reports ("ok", result) or ("err", type, text, traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's: it terminates the ranks
    if spec.tmpdir:  # where this rank was when its launcher gave up on it (a file each: dumps would interleave)
        global _stack_file
        _stack_file = open(_stack_path(spec.tmpdir, rank), "w")  # noqa: SIM115 (open while the process lives)
        faulthandler.register(STACK_SIGNAL, file=_stack_file, all_threads=True)
    if spec.env is not None:
        os.environ.clear()
        os.environ.update(spec.env)
    _exit_with_parent(spec)
    if spec.backend == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # already inherited; repeated in case the env was scrubbed
    import torch.distributed as dist

    heap = None
    ok = False
    try:
        with open(spec.call_path, "rb") as f:
            fn, args, kwargs = pickle.load(f)
        fn = _resolve_fn(fn)
        store = dist.FileStore(spec.store_path, spec.world)
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=spec.world, timeout=timedelta(seconds=spec.timeout)
        )
        heap = _make_heap(spec, rank)
        with use_heap(heap):
            result = fn(heap, *args, **kwargs)
        payload = pickle.dumps(("ok", _portable(result)), protocol=pickle.HIGHEST_PROTOCOL)
        ok = True
    except BaseException as e:
        line = _first_line(e)
        text = f"{type(e).__name__}: {line}" if line else type(e).__name__
        if getattr(e, "__notes__", None):  # context a caller added (which case, which call): the host shows it
            text += f" [{'; '.join(map(str, e.__notes__))}]"
        payload = pickle.dumps(("err", type(e).__name__, text, traceback.format_exc()))
    try:
        conn.send_bytes(payload)
        conn.close()
        if ok:
            heap.barrier()  # no rank unmaps its heap while a peer may still be reading it
    except Exception:
        pass  # the result is delivered (or the parent is gone); teardown noise helps nobody
    finally:
        if heap is not None:
            heap.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def _resolve_fn(fn):
    """A "module:function" string is imported here, in the rank, so the parent need not import it."""
    if not isinstance(fn, str):
        return fn
    module, _, name = fn.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _make_heap(spec: _RankSpec, rank: int):
    if spec.backend == "cpu":
        import torch

        from .cpu_heap import ShmHeap

        torch.set_num_threads(1)  # ranks share the cores; the interpreter is single-threaded anyway
        return ShmHeap(rank, spec.world, spec.shm_paths, spec.heap_bytes, timeout=spec.timeout)
    if spec.backend == "nvshmem":
        from .nvshmem_heap import NvshmemHeap

        return NvshmemHeap(spec.heap_bytes, timeout=spec.timeout)
    from .iris_heap import IrisHeap

    return IrisHeap(spec.heap_bytes, timeout=spec.timeout)


def _exit_with_parent(spec: _RankSpec) -> None:
    """If the launcher dies without cleaning up (SIGKILL), or stays stopped, do not linger spinning on a flag: remove
    what it would have removed (its heap files and folder: the launcher pid in their names is this run's) and exit.
    A thread polling the launcher pid rather than PR_SET_PDEATHSIG, whose SIGKILL would leave the files behind.
    The pid comes from the launcher itself: the rank may start after the launcher died (getppid() is then init)."""
    launcher = spec.launcher_pid or os.getppid()
    parent = os.getppid()  # the launcher, or the fork server (which exits with the launcher)
    watch = PeerWatch({"launcher": launcher})

    def gone() -> bool:
        return os.getppid() != parent or watch.lost(force=True) is not None

    def run():
        while not gone():
            time.sleep(_POLL_S)
        unlink_quietly(spec.shm_paths)
        if spec.tmpdir:
            shutil.rmtree(spec.tmpdir, ignore_errors=True)
        os._exit(_EXIT_ORPHANED)

    threading.Thread(target=run, name="tilec-launcher-watch", daemon=True).start()


def _first_line(e: BaseException) -> str:
    """The one line a rank's error is reported by: its message's first line, and where that is only a header (Triton's
    CompilationError starts "at 11:12:", the source and the reason follow) the last line too, which says what went
    wrong."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    if not lines:
        return ""
    if len(lines) > 1 and lines[0].endswith(":"):
        return f"{lines[0]} ... {lines[-1]}"
    return lines[0]


def _portable(obj: Any) -> Any:
    """Results travel by pickle: copy tensors to compact CPU tensors (a heap view would drag the whole
    heap along, and a GPU tensor would need CUDA in the parent)."""
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        if t.storage_offset() or t.untyped_storage().nbytes() != t.numel() * t.element_size():
            t = t.clone(memory_format=torch.contiguous_format)
        return t
    if isinstance(obj, dict):
        return type(obj)((k, _portable(v)) for k, v in obj.items())
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_portable(v) for v in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(_portable(v) for v in obj)
    return obj


# -- launcher side -------------------------------------------------------------------------------


@contextmanager
def _child_env(backend: str):
    """Children inherit the environment at start(): TRITON_INTERPRET must be there before the child
    imports triton (which may happen while unpickling, or when spawn re-imports the main module)."""
    saved = os.environ.get("TRITON_INTERPRET")
    if backend == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


@contextmanager
def _sigterm_as_exit():
    """Turn the first SIGTERM or SIGHUP into SystemExit while ranks run, so `finally` cleanup still happens, and
    ignore later ones until it has (signals whose handler someone else set are left to it; Ctrl-C is already
    KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        # the cleanup this starts (the ranks' stacks, killing and reaping them, removing files) runs to its end: a
        # second signal would cut it short, and one often follows (`timeout` signals its whole process group, then
        # a wrapper script forwards the same signal)
        for sig in prev:
            signal.signal(sig, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    prev = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            prev[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, old in prev.items():
            signal.signal(sig, old)


def _exit_text(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code == _EXIT_ORPHANED:
        return f"gave up on its launcher (stopped for over {PeerWatch({}).grace:g} s, or gone) and exited"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


STACK_SIGNAL = signal.SIGUSR1
_STACK_WAIT_S = 2.0
_stack_file = None


def _stack_path(tmpdir: str, rank: int) -> str:
    return os.path.join(tmpdir, f"stack{rank}.txt")


def _dump_stacks(procs: list, ranks, tmpdir: str) -> None:
    """Ask the ranks still running to write their Python stacks (every thread), then print them to stderr, one rank
    after another: a rank stuck in a compile, a host barrier or a CUDA synchronize says which before it is killed."""
    alive = {r: procs[r] for r in ranks if r < len(procs) and procs[r].is_alive()}
    for p in alive.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, STACK_SIGNAL)
    deadline = time.monotonic() + _STACK_WAIT_S
    stacks: dict[int, str] = {}
    for r in alive:
        while time.monotonic() < deadline:  # written from the rank's signal handler at once: done once it holds still
            time.sleep(0.1)
            with contextlib.suppress(OSError), open(_stack_path(tmpdir, r)) as f:
                text = f.read()
                if text and text == stacks.get(r):
                    break
                stacks[r] = text
    for r, text in stacks.items():
        if text.strip():
            sys.stderr.write(f"tilec: rank {r} (pid {alive[r].pid}) was here when the launcher gave up on it:\n{text}")
    sys.stderr.flush()


def _stop(procs: list, graceful: bool) -> None:
    """Join (graceful) or terminate every rank process; escalate to SIGKILL if needed. A stopped rank is continued
    after its SIGTERM, so that it dies now rather than at the SIGKILL."""
    if graceful:
        deadline = time.monotonic() + _CLEANUP_GRACE_S
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.terminate()
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
    deadline = time.monotonic() + _TERM_GRACE_S
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(1.0)


def spawn(
    fn: Callable[..., Any] | str,
    world: int,
    *,
    backend: str = "cpu",
    heap_bytes: int = 1 << 26,
    timeout: float = 300.0,
    args: tuple = (),
    kwargs: dict | None = None,
    log: Callable[[str], None] | None = None,
    start_method: str | None = None,
) -> list:
    """Run `fn(heap, *args, **kwargs)` in `world` rank processes; return the results in rank order.

    `fn` must be importable by the children: a module-level function, or a "module:function" string
    (then only the ranks import that module, e.g. one that imports triton). Its result must be
    picklable; tensors in the result come back as compact CPU copies. backend "cpu" runs kernels in the Triton
    interpreter over /dev/shm heaps; "iris" puts rank r on GPU r % device_count ("auto" picks).
    Raises RankError if a rank raises, dies or stays stopped (SIGSTOP) for over TILEC_STOP_GRACE seconds (3),
    LaunchTimeout if ranks are still running after `timeout` seconds (wall clock); in every case all ranks are
    terminated and reaped and the run's heap files removed first. `timeout` also bounds each host barrier inside
    the ranks. Ranks exit, removing the run's files, when the launcher dies or stays stopped; heap files of
    launchers that died before anyone could remove them are removed at the next start.
    start_method: "spawn" (a fresh interpreter per rank) or "forkserver" (ranks fork from a server process that
    imported torch once; they get the launcher's environment all the same); None: the module's `start_method`.
    """
    if world < 1:
        raise ValueError(f"world must be >= 1, got {world}")
    method = start_method or globals()["start_method"]
    if method not in START_METHODS:
        raise ValueError(f"start_method {method!r}: expected one of {START_METHODS}")
    if getattr(mp.current_process(), "_inheriting", False):
        raise TilecRuntimeError(
            "spawn() was called while a rank process imported the main module; "
            "put the launching code under `if __name__ == '__main__':`"
        )
    backend = _resolve_backend(backend)
    say = log or (lambda msg: None)
    if isinstance(fn, str) and ":" not in fn:
        raise ValueError(f"fn {fn!r}: expected 'module:function'")
    try:
        call = pickle.dumps((fn, tuple(args), dict(kwargs or {})))
    except Exception as e:
        raise TilecRuntimeError(
            f"cannot send {fn!r} and its arguments to rank processes ({e}); use a module-level function"
        ) from e
    nbytes = shm_round(heap_bytes) if backend == "cpu" else int(heap_bytes)
    tag = f"{os.getpid()}_{uuid.uuid4().hex[:8]}"
    if backend == "cpu":
        remove_stale()
    _remove_stale_tmpdirs()
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(["torch", "torch.distributed"])  # the server starts once, at the first launch
    procs: list = []
    conns: list = []
    shm_paths: list[str] = []
    tmpdir = tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{tag}-")
    graceful = False
    try:
        with _sigterm_as_exit():
            if backend == "cpu":
                shm_paths = create_shm_files(world, nbytes, tag)
            call_path = os.path.join(tmpdir, "call.pkl")
            with open(call_path, "wb") as f:
                f.write(call)
            spec = _RankSpec(world, backend, nbytes, timeout, os.path.join(tmpdir, "store"), shm_paths, call_path,
                             os.getpid(), tmpdir)
            say(f"tilec: starting {world} ranks, backend {backend}, heap {nbytes / 2**20:g} MiB each")
            t0 = time.monotonic()
            with _child_env(backend):
                if method == "forkserver":
                    spec.env = dict(os.environ)
                for r in range(world):
                    recv, send = ctx.Pipe(duplex=False)
                    conns.append(recv)
                    p = ctx.Process(target=_rank_main, args=(spec, r, send), name=f"tilec-rank{r}", daemon=True)
                    try:
                        p.start()
                    finally:
                        send.close()  # keep only the child's end open, so its death reads as EOF
                    procs.append(p)  # only started processes: join() asserts on the others
            try:
                results = _collect(procs, conns, t0 + timeout, timeout)
            except (LaunchTimeout, SystemExit, KeyboardInterrupt) as e:  # gave up without a rank saying why
                _dump_stacks(procs, getattr(e, "ranks", range(world)), tmpdir)
                raise
            graceful = True
            say(f"tilec: {world} ranks done in {time.monotonic() - t0:.1f} s")
            return results
    finally:
        _stop(procs, graceful)
        for c in conns:
            c.close()
        unlink_quietly(shm_paths)
        shutil.rmtree(tmpdir, ignore_errors=True)


def _remove_stale_tmpdirs() -> None:
    """Remove spawn folders (call, store) of launchers that died before removing them: only this user's folders
    named like spawn's whose launcher pid is gone."""
    root = tempfile.gettempdir()
    try:
        names = os.listdir(root)
    except OSError:
        return
    for name in names:
        pid, sep, rest = name.removeprefix(_TMP_PREFIX).partition("_")
        if not (name.startswith(_TMP_PREFIX) and sep and pid.isdigit() and len(rest) > 9 and rest[8] == "-"):
            continue
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if st.st_uid == os.getuid() and os.path.isdir(path) and not os.path.islink(path) and is_gone(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _check_stopped(procs: list, pending: set, watch: PeerWatch) -> None:
    """A rank stopped (SIGSTOP) for longer than the grace never reports: fail now, naming it, not at the timeout."""
    watch.pids = {r: procs[r].pid for r in pending}  # a rank that reported may exit
    lost = watch.lost()
    if lost and lost[0] in pending and proc_state(lost[1]) == "T":
        r, pid, why = lost
        raise RankError(r, f"{why}; all ranks were killed", details=f"rank {r} (pid {pid}) {why}")


def _collect(procs: list, conns: list, deadline: float, timeout: float) -> list:
    results: list = [None] * len(procs)
    pending = set(range(len(procs)))
    watch = PeerWatch({r: p.pid for r, p in enumerate(procs)})
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise LaunchTimeout(sorted(pending), timeout)
        _check_stopped(procs, pending, watch)
        waitables = {conns[r]: r for r in pending} | {procs[r].sentinel: r for r in pending}
        for obj in _wait(list(waitables), timeout=min(left, _POLL_S)):
            r = waitables[obj]
            if r not in pending:
                continue  # its pipe and its sentinel were both ready
            if conns[r].poll():
                try:
                    msg = pickle.loads(conns[r].recv_bytes())
                except EOFError:
                    msg = None
                except Exception as e:  # e.g. the result's class cannot be imported here
                    raise RankError(r, f"its result could not be unpickled: {type(e).__name__}: {e}") from e
            else:
                msg = None  # sentinel ready and nothing sent
            if msg is None:
                raise _died(procs, r)
            if msg[0] == "ok":
                results[r] = msg[1]
                pending.discard(r)
            else:
                _, exc_type, text, details = msg
                if exc_type == "PeerLost":  # a symptom: the peer that ended first is the error to report
                    for other in sorted(pending - {r}):
                        procs[other].join(0.5)
                        if procs[other].exitcode is None:
                            continue
                        first = _message(conns[other])
                        if first is None:
                            raise _died(procs, other)
                        if first[0] != "ok" and first[1] != "PeerLost":
                            raise RankError(other, first[2], details=first[3], exc_type=first[1])
                raise RankError(r, text, details=details, exc_type=exc_type)
    return results


def _message(conn):
    """What a rank that has ended sent, or None (a pipe at EOF: it sent nothing)."""
    try:
        return pickle.loads(conn.recv_bytes()) if conn.poll() else None
    except (EOFError, OSError):
        return None


def _died(procs: list, r: int) -> RankError:
    """Rank r's process ended without sending a result or an error."""
    procs[r].join(1.0)
    code = procs[r].exitcode
    return RankError(r, f"{_exit_text(code)} before reporting a result (its stderr may say why)", exitcode=code,
                     details=f"rank {r} {_exit_text(code)} without sending a result or an error")


# -- torchrun ------------------------------------------------------------------------------------

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")


def under_torchrun() -> bool:
    """Whether this process is one rank of a torchrun launch (it then builds its own heap with from_env)."""
    return "RANK" in os.environ and "LOCAL_RANK" in os.environ


def from_env(backend: str | None = "iris", heap_bytes: int = 1 << 26, *, timeout: float = 300.0, activate: bool = True):
    """Build this process's heap under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR set).

    Initializes a gloo default process group unless one exists (create NCCL groups for baselines
    with dist.new_group(backend="nccl")); heap.close() destroys the group if this call made it.
    With activate=True the heap becomes the process's active heap.
    """
    backend = _resolve_backend(backend)
    missing = [v for v in _TORCHRUN_VARS if v not in os.environ]
    if missing:
        raise TilecRuntimeError(f"from_env needs torchrun's environment; missing {', '.join(missing)}")
    if backend == "cpu":
        _prepare_shm_env()
        # the heap files are named by torchrun's run id, rank 0's pid and a random tag: concurrent or crashed runs
        # never collide
        run = os.environ.get("TORCHELASTIC_RUN_ID", "run").replace("/", "_")
        return _in_group(lambda: _group_shm_heap(None, heap_bytes, timeout, f"torchrun_{run}"), timeout, activate)

    def iris_heap():
        if backend == "nvshmem":
            from .nvshmem_heap import NvshmemHeap

            return NvshmemHeap(heap_bytes, timeout=timeout)
        from .iris_heap import IrisHeap

        return IrisHeap(heap_bytes, timeout=timeout)

    def pick_device():
        import torch

        from .iris_heap import rank_device

        torch.cuda.set_device(rank_device(int(os.environ["RANK"])))

    # NVSHMEM's heap picks its GPU itself, after the group exists (and says so when there is none or MPS is missing)
    return _in_group(iris_heap, timeout, activate, None if backend == "nvshmem" else pick_device)


def _in_group(make_heap, timeout: float, activate: bool, before_group=None):
    """make_heap() inside torchrun's gloo default group, made here (after before_group()) unless one exists; the
    heap destroys a group made here when it closes, and a failed make_heap leaves none behind."""
    import torch.distributed as dist

    made_group = False
    if not dist.is_initialized():
        if before_group is not None:
            before_group()
        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=timeout))
        made_group = True
    try:
        heap = make_heap()
    except BaseException:
        if made_group:
            dist.destroy_process_group()
        raise
    if made_group:
        heap._destroy_group_on_close = True
    if activate:
        _install(heap)
    return heap


def _prepare_shm_env() -> None:
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise TilecRuntimeError("the cpu backend runs kernels in Triton's interpreter: set TRITON_INTERPRET=1 before"
                                " triton is imported (tilec sets it itself when it builds the heap first)")
    world = int(os.environ["WORLD_SIZE"])
    if int(os.environ.get("LOCAL_WORLD_SIZE", world)) != world:
        raise TilecRuntimeError("the cpu backend maps every rank's heap file, so every rank must run on one host "
                                f"(LOCAL_WORLD_SIZE {os.environ.get('LOCAL_WORLD_SIZE')} != WORLD_SIZE {world})")
    os.environ["TRITON_INTERPRET"] = "1"  # generated modules are imported after this, so their kernels interpret


# -- an existing process group ---------------------------------------------------------------------------------


def from_process_group(group=None, *, backend: str | None = None, heap_bytes: int = 1 << 26, timeout: float = 300.0,
                       activate: bool = True):
    """This process's heap over an existing torch.distributed process group (default: the default group), whatever
    launched the processes (torchrun, a job scheduler, a serving engine): rank and world come from the group, and
    its ranks set the heap up together. Every op of the process then shares this heap (activate=True makes it the
    active heap). backend: "iris" or "nvshmem" (GPU, needs the group to be the whole default group: each sets itself
    up over it) or "cpu" (the /dev/shm emulation: every rank on one host, barriers over `group`, gloo); default: iris
    where a GPU is. The group is the caller's: closing the heap leaves it alone."""
    import torch.distributed as dist

    backend = _resolve_backend(backend)
    if not (dist.is_available() and dist.is_initialized()):
        raise TilecRuntimeError("from_process_group needs torch.distributed initialized first "
                                "(dist.init_process_group(...)); or use from_env() under torchrun")
    group = group if group is not None else dist.group.WORLD
    if heap_bytes < 1:
        raise TilecRuntimeError(f"heap_bytes={heap_bytes}: must be >= 1")
    if backend == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise TilecRuntimeError("the cpu backend runs kernels in Triton's interpreter: set TRITON_INTERPRET=1 "
                                    "before triton is imported")
        os.environ["TRITON_INTERPRET"] = "1"
        heap = _group_shm_heap(group, heap_bytes, timeout)
    else:
        if dist.get_world_size(group) != dist.get_world_size():
            raise TilecRuntimeError(f"the {backend} backend sets its heap up over the default process group: pass the"
                                    f" whole group (this one has {dist.get_world_size(group)} of "
                                    f"{dist.get_world_size()} ranks)")
        if backend == "nvshmem":  # it picks its GPU itself (and says so when there is none or MPS is missing)
            from .nvshmem_heap import NvshmemHeap

            heap = NvshmemHeap(heap_bytes, timeout=timeout)
        else:
            import torch

            from .iris_heap import IrisHeap, rank_device

            torch.cuda.set_device(rank_device(dist.get_rank()))
            heap = IrisHeap(heap_bytes, timeout=timeout)
    if activate:
        _install(heap)
    return heap


def _group_shm_heap(group, heap_bytes: int, timeout: float, prefix: str = "pg"):
    """Each rank of `group` creates its /dev/shm heap file under a name rank 0 picks and broadcasts, then maps every
    rank's; files are unlinked once all have mapped them (a crash later leaks nothing)."""
    import torch.distributed as dist

    from .cpu_heap import ShmHeap
    from .heap import _align

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    tag = [f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}" if rank == 0 else None]
    dist.broadcast_object_list(tag, src=0 if group is None else dist.get_global_rank(group, 0), group=group)
    nbytes = _align(heap_bytes)
    mine = create_shm_files(1, nbytes, f"{tag[0]}_of{rank}")
    try:
        dist.barrier(group=group)  # every rank's file exists
        paths = [mine[0].replace(f"_of{rank}_r0", f"_of{r}_r0") for r in range(world)]
        return ShmHeap(rank, world, paths, nbytes, unlink=True, timeout=timeout, group=group)
    except BaseException:
        unlink_quietly(mine)
        raise
