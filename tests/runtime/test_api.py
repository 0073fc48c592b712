"""Import hygiene and the parts of the API that need no rank processes."""

import subprocess
import sys
from pathlib import Path

import pytest

import tilec.runtime as rt

ROOT = Path(__file__).resolve().parents[2]


def test_import_is_light():
    code = "import sys, tilec.runtime; print(sorted(m for m in ('triton', 'iris') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_public_names():
    for name in (
        "Heap",
        "ShmHeap",
        "IrisHeap",
        "spawn",
        "from_env",
        "active_heap",
        "use_heap",
        "default_backend",
        "HeapError",
        "RankError",
        "LaunchTimeout",
        "TilecRuntimeError",
    ):
        assert hasattr(rt, name), name
    assert issubclass(rt.HeapError, rt.TilecRuntimeError)
    assert issubclass(rt.RankError, rt.TilecRuntimeError) and issubclass(rt.LaunchTimeout, rt.TilecRuntimeError)


def test_default_backend_matches_torch():
    import torch

    assert rt.default_backend() == ("iris" if torch.cuda.is_available() else "cpu")


def test_from_env_errors(monkeypatch):
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(rt.TilecRuntimeError, match="missing RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR"):
        rt.from_env("iris")
    for v, x in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"), ("MASTER_ADDR", "127.0.0.1")):
        monkeypatch.setenv(v, x)
    import triton  # noqa: F401 - imported without the interpreter: the cpu backend cannot run kernels then

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(rt.TilecRuntimeError, match="set TRITON_INTERPRET=1 before triton is imported"):
        rt.from_env("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with pytest.raises(rt.TilecRuntimeError, match="every rank must run on one host"):
        rt.from_env("cpu")


def test_iris_heap_needs_process_group():
    with pytest.raises(rt.TilecRuntimeError, match="torch.distributed initialized"):
        rt.IrisHeap(1 << 20)


def test_iris_heap_size_rounding():
    from tilec.runtime.iris_heap import iris_heap_size

    assert iris_heap_size(1 << 26) == 1 << 26
    assert iris_heap_size(100 << 20) == 128 << 20
    assert iris_heap_size(1) == 1 << 21


def test_rank_error_pickles():
    import pickle

    e = pickle.loads(pickle.dumps(rt.RankError(2, "KeyError: 'x'", details="tb", exc_type="KeyError")))
    assert str(e) == "rank 2: KeyError: 'x'" and e.details == "tb" and e.rank == 2
    t = pickle.loads(pickle.dumps(rt.LaunchTimeout([1, 3], 5.0)))
    assert t.ranks == [1, 3] and "ranks still running: 1, 3" in str(t)
