"""Shared fixtures of the compiler tests: goldens (--update-golden), example sources, /dev/shm hygiene."""

from __future__ import annotations

import difflib
import glob
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
GOLDEN = TESTS / "golden"
PROGRAMS = TESTS / "programs"
EXAMPLE = ROOT / "examples" / "ag_gemm.tile"

if str(ROOT) not in sys.path:  # rank processes inherit sys.path and import tests._workers
    sys.path.insert(0, str(ROOT))

_CACHE: str | None = None


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite the files under tests/golden/ from the current output instead of comparing")


def pytest_configure(config):
    # generated modules go to a private cache (rank processes inherit the environment), not ~/.cache/tilec
    global _CACHE
    if "TILEC_CACHE" not in os.environ:
        _CACHE = tempfile.mkdtemp(prefix="tilec-test-cache-")
        os.environ["TILEC_CACHE"] = _CACHE
    # the suite launches ranks a few hundred times: fork them from one server that imported torch once (~2 s of CPU
    # less per rank) instead of starting a fresh interpreter each; tests of the fresh-interpreter path pass
    # start_method="spawn", and launchers in subprocesses (the fault tests, the CLI) keep the default
    from tilec.runtime import launcher

    launcher.start_method = "forkserver"


def pytest_unconfigure(config):
    # stop the fork server (if a launch started one) so that it is reaped here, with its ranks' CPU time counted
    from multiprocessing import forkserver

    stop = getattr(forkserver._forkserver, "_stop", None)
    if stop is not None:
        stop()
    if _CACHE is not None:
        os.environ.pop("TILEC_CACHE", None)
        shutil.rmtree(_CACHE, ignore_errors=True)


class Golden:
    """`golden("dir/name.txt", text)`: compare text with tests/golden/dir/name.txt byte for byte (or rewrite it
    under --update-golden)."""

    def __init__(self, update: bool):
        self.update = update

    def __call__(self, name: str, text: str) -> None:
        path = GOLDEN / name
        if self.update:
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists() or path.read_bytes() != text.encode():
                path.write_bytes(text.encode())
            return
        if not path.exists():
            pytest.fail(f"golden file {path.relative_to(ROOT)} does not exist; run `pytest --update-golden` to "
                        "create it", pytrace=False)
        want = path.read_bytes().decode()
        if text != want:
            diff = "".join(difflib.unified_diff(want.splitlines(keepends=True), text.splitlines(keepends=True),
                                                f"golden/{name}", "actual"))
            pytest.fail(f"output differs from golden/{name} (run `pytest --update-golden` if the change is "
                        f"intended):\n{diff}", pytrace=False)


@pytest.fixture
def golden(request) -> Golden:
    return Golden(request.config.getoption("--update-golden"))


@pytest.fixture(scope="session")
def example_source() -> str:
    return EXAMPLE.read_text()


def shm_leftovers() -> list[str]:
    """Heap files of spawns started by this process (spawn names them tilec_<launcher pid>_...)."""
    return glob.glob(f"/dev/shm/tilec_{os.getpid()}_*")


@pytest.fixture
def no_shm_leftovers():
    assert shm_leftovers() == []
    yield
    assert shm_leftovers() == [], "a spawn left heap files in /dev/shm"
