"""`tilec --help` and `--version` answer at once: building the argument parser imports no torch, triton or iris
(each a second or more to import), and the choices it offers are the compiler's own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._util import ROOT

HEAVY = ("torch", "triton", "iris", "tritonblas", "numpy", "networkx", "lark", "jinja2")


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def _imported(importtime: str) -> set[str]:
    """Top-level package names in `python -X importtime` output."""
    names = set()
    for line in importtime.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["run", "--help"], ["show", "--help"],
                                  ["taxes", "--help"]])
def test_help_and_version_import_nothing_heavy(argv):
    p = _run("-X", "importtime", "-m", "tilec", *argv)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "tilec" in p.stdout
    imported = _imported(p.stderr)
    assert "tilec" in imported  # the measurement saw tilec's own imports
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


def test_version_is_quick():
    """Under 0.3 s beyond the interpreter's own start (the best of three of each, so a busy machine does not count)."""

    def best(*args: str) -> float:
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            p = _run(*args)
            times.append(time.perf_counter() - t0)
            assert p.returncode == 0, p.stderr
        return min(times)

    overhead = best("-m", "tilec", "--version") - best("-c", "pass")
    assert overhead < 0.3, f"tilec --version takes {overhead:.2f} s more than python -c pass"


def test_the_names_module_imports_nothing():
    from tilec.passes import names

    src = Path(names.__file__).read_text()
    assert not re.search(r"^\s*(import|from)\s", src, re.M), "tilec/passes/names.py must stay free of imports"


def test_public_names_load_on_first_use():
    p = _run("-c", "import sys, tilec; assert 'torch' not in sys.modules; tilec.compile; tilec.op; tilec.runtime.spawn;"
             " from tilec import CompiledProgram, TileOp, empty; assert 'torch' in sys.modules;"
             " print(sorted(n for n in tilec.__all__ if n not in dir(tilec)))")
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "[]"
