"""The torchrun path (how multi-GPU machines run tilec), exercised on the CPU emulation: each torchrun rank builds
its own /dev/shm heap and maps its peers' (tilec.runtime.from_env("cpu"))."""

import os
import subprocess
import sys

import pytest

from tests._util import ROOT


def _torchrun(*args, env=None, timeout=600):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "tilec",
           *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


@pytest.mark.slow
def test_run_under_torchrun_matches_the_reference(tmp_path):
    before = set(os.listdir("/dev/shm"))
    res = _torchrun("run", "examples/ag_gemm.tile", "--backend", "cpu", "-D", "M=96", "-D", "N=64", "-D", "K=64",
                    env={"TILEC_CACHE": str(tmp_path)})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    ok = [ln for ln in res.stdout.splitlines() if " ok: " in ln]
    assert "torchrun" in res.stdout and len(ok) == 5, res.stdout  # every schedule, reported once (rank 0)
    assert not {f for f in set(os.listdir("/dev/shm")) - before if f.startswith("tilec")}  # heap files unlinked


@pytest.mark.slow
def test_tune_under_torchrun_records_every_schedule(tmp_path):
    res = _torchrun("tune", "examples/ag_gemm.tile", "--backend", "cpu", "--iters", "1", "-D", "M=64", "-D", "N=64",
                    "-D", "K=32", env={"TILEC_CACHE": str(tmp_path)})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert res.stdout.count("measured ") == 5 and "fastest measured:" in res.stdout, res.stdout
