"""The torchrun path (how multi-GPU machines run tilec), exercised on the CPU emulation: each torchrun rank builds
its own /dev/shm heap and maps its peers' (tilec.runtime.from_env("cpu"))."""

import glob
import os
import re
import subprocess
import sys
import uuid

import pytest

from tests._util import ROOT


def _torchrun(*args, env=None, timeout=600, run_id=None):
    """torchrun with a rendezvous id of our own (the heap files' names carry it), like --standalone otherwise."""
    run_id = run_id or f"tilectest{uuid.uuid4().hex[:12]}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
           "--rdzv-id", run_id, "--nnodes", "1", "--nproc-per-node", "2", "-m", "tilec", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _heap_files_of(run_id: str) -> list[str]:
    """This run's heap files only (tilec.runtime.launcher names them tilec_torchrun_<run id>_...): other tilec
    processes on the machine may hold theirs."""
    return glob.glob(f"/dev/shm/tilec_torchrun_{run_id}_*")


@pytest.mark.slow
def test_run_under_torchrun_matches_the_reference(tmp_path):
    run_id = f"tilectest{uuid.uuid4().hex[:12]}"
    res = _torchrun("run", "examples/ag_gemm.tile", "--backend", "cpu", "-D", "M=96", "-D", "N=64", "-D", "K=64",
                    env={"TILEC_CACHE": str(tmp_path)}, run_id=run_id)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    ok = [ln for ln in res.stdout.splitlines() if " ok: " in ln]
    assert "torchrun" in res.stdout and len(ok) == 5, res.stdout  # every schedule, reported once (rank 0)
    assert _heap_files_of(run_id) == []  # heap files unlinked


@pytest.mark.slow
@pytest.mark.parametrize("per_node", [None, 1])
def test_tune_under_torchrun_records_every_schedule(tmp_path, per_node):
    nodes = ["--ranks-per-node", str(per_node)] if per_node else []  # 1: backend nvshmem's kernels, off-node paths
    res = _torchrun("tune", "examples/ag_gemm.tile", "--backend", "cpu", "--iters", "1", "-D", "M=64", "-D", "N=64",
                    "-D", "K=32", *nodes, env={"TILEC_CACHE": str(tmp_path)})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    # every schedule that applies (5), and on one node the ones whose gather the copy engines can move (+dma; they
    # reach peers by pointer only on a node), timed once each
    n = int(re.search(r"\[1/(\d+)\]", res.stdout).group(1))
    assert n == (5 if per_node else 7) and ("flags+dma" in res.stdout) == (not per_node), res.stdout
    assert res.stdout.count("measured ") == n and "fastest measured:" in res.stdout, res.stdout


@pytest.mark.slow
def test_bench_under_torchrun_across_nodes_with_options(tmp_path):
    """`torchrun ... tilec bench --ranks-per-node 1 --fold off`: each rank builds its heap over the process group,
    times backend nvshmem's kernels (off-node puts and gets on the CPU emulation) built without fold-last, and rank 0
    writes rows that match the reference and say what they were built with."""
    import json

    res = _torchrun("bench", "examples/ag_gemm.tile", "--backend", "cpu", "--ranks-per-node", "1", "--shapes", "small",
                    "--schedules", "bsp,fused-push", "--no-tune", "--iters", "1", "--fold", "off", "--out",
                    str(tmp_path / "out"), env={"TILEC_CACHE": str(tmp_path / "cache")})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    js = json.loads((tmp_path / "out" / "ag_gemm_small_bf16.json").read_text())
    assert "fold=off" in js["meta"]["options"]
    ours = [r for r in js["rows"] if r["kind"] == "tilec"]
    assert {r["name"] for r in ours} == {"bsp", "fused-push"} and len(ours) == 2 * len({str(r["shape"]) for r in ours})
    assert all(r["kernels"] == "nvshmem" and r["ranks_per_node"] == 1 and r["rel_err"] < 0.02 for r in ours), ours


def test_nvshmem_without_a_gpu_under_torchrun_says_so():
    """A rank that builds backend nvshmem's heap under torchrun where no GPU is: NVSHMEM's own message, one line per
    rank, exit 2 (not Iris's, whose device pick used to run first)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    res = _torchrun("run", "examples/ag_gemm.tile", "--backend", "nvshmem", "-s", "bsp", timeout=300)
    assert res.returncode != 0
    said = [ln for ln in res.stderr.splitlines() if "needs a CUDA GPU" in ln]
    assert len(said) == 2 and all(ln.startswith("backend nvshmem needs a CUDA GPU") for ln in said), res.stderr[-2000:]
    assert "iris" not in " ".join(said)
