"""benchmarks/runs/mps_world.sh where MPS is unavailable or the call is wrong: exit 2 with a one-line reason, and the
command is never run (the CPU machines have no nvidia-cuda-mps-control)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "runs" / "mps_world.sh"


def _run(*args, path=None):
    env = {**os.environ, "PATH": path if path is not None else os.environ.get("PATH", "")}
    return subprocess.run(["sh", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.skipif(shutil.which("nvidia-cuda-mps-control") is not None, reason="MPS is available here")
def test_no_mps_is_a_clear_error(tmp_path):
    marker = tmp_path / "ran"
    res = _run("2", "touch", str(marker))
    assert res.returncode == 2 and "MPS is unavailable here" in res.stderr and "nvidia-cuda-mps-control" in res.stderr
    assert not marker.exists()


@pytest.mark.parametrize("args", [(), ("two", "true"), ("0", "true"), ("2",), ("--spawn",)])
def test_bad_calls_say_how_to_call_it(args):
    res = _run(*args)
    assert res.returncode == 2 and res.stderr.startswith("usage: mps_world.sh [--spawn] W CMD"), res.stderr
