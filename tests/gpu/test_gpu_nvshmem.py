"""GPU: every example on backend nvshmem (torch symmetric memory with the NVSHMEM backend), every schedule that
applies, at worlds 2 and 4: on one node (ranks_per_node = world: peers by pointer into the symmetric heap) and as
several "nodes" (ranks_per_node 1, and 2 at world 4: those peers by NVSHMEM puts, gets and signal words, which on
one GPU under MPS go through NVSHMEM's own transport). Ranks side by side on one GPU need MPS
(benchmarks/runs/mps_world.sh --spawn W python -m pytest -m gpu tests/gpu/test_gpu_nvshmem.py --world W); without
it, and without NVSHMEM, a launch must fail with a clear error, not hang."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tilec
from tests import _workers
from tests._util import ROOT, make_calls, rel_err
from tilec.errors import ScheduleError
from tilec.passes.schedules import SCHEDULES
from tilec.run_vs_reference import compare_calls
from tilec.runtime import spawn

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]

EXAMPLES = {  # small shapes: a few tiles per rank
    "ag_gemm": lambda w: {"M": 64 * w, "N": 128, "K": 64},
    "gemm_rs": lambda w: {"M": 64 * w, "N": 128, "K": 64 * w},
    "gemm_ar": lambda w: {"M": 64 * w, "N": 128, "K": 64 * w},
    "flash_decode": lambda w: {"B": 2, "HKV": 2, "G": 4, "D": 64, "S": 128, "BS": 32},
    "flash_decode_splits": lambda w: {"B": 2, "HKV": 2, "G": 4, "D": 64, "S": 100, "NS": 3, "L": 40, "BS": 64},
    "ring_all_gather": lambda w: {"M": 64 * w, "K": 64},
    "ring_ag_gemm": lambda w: {"M": 64 * w, "N": 128, "K": 64},
    "ring_reduce_scatter": lambda w: {"M": 64 * w, "N": 64},
}


def _runnable(world: int) -> str | None:
    from tilec.runtime.launch import mps_client
    from tilec.runtime.nvshmem_heap import nvshmem_available

    if not nvshmem_available():
        return "torch has no NVSHMEM (is_nvshmem_available() is False)"
    if world > torch.cuda.device_count() and not mps_client():
        return "ranks share a GPU without MPS (test_without_mps_is_a_clear_error covers it)"
    return None


def _cases(world: int, per_node: int):
    batch, meta = [], {}
    for example, dims in EXAMPLES.items():
        for schedule in SCHEDULES:
            try:
                prog = tilec.compile(f"examples/{example}.tile", world=world, schedule=schedule, dims=dims(world),
                                     backend="nvshmem", ranks_per_node=per_node, wait_timeout=30)
            except ScheduleError:
                continue
            calls = make_calls(prog, 2, seed=world * 7 + per_node)
            if "lens" in prog.signature():
                for per_rank in calls:
                    for d in per_rank:
                        d["lens"] = torch.randint(1, dict(prog.program.dims)["S"] * world + 1, d["lens"].shape,
                                                  dtype=torch.int32)
            key = (example, schedule, per_node)
            batch.append((key, prog, calls, ()))
            meta[key] = (prog, calls)
    if per_node == world:  # one node: the copy engines copy between the ranks' symmetric memory by pointer
        prog = tilec.compile("examples/ag_gemm.tile", world=world, schedule="flags", dims=EXAMPLES["ag_gemm"](world),
                             backend="nvshmem", transport="dma", wait_timeout=30)
        calls = make_calls(prog, 2, seed=3)
        batch.append((("ag_gemm", "flags+dma", per_node), prog, calls, ()))
        meta[("ag_gemm", "flags+dma", per_node)] = (prog, calls)
    return batch, meta


@pytest.mark.parametrize("per_node", ["world", 1, 2])
@pytest.mark.parametrize("world", [2, 4])
def test_every_example_on_nvshmem(world, per_node):
    if per_node == 2 and world == 2:
        pytest.skip("ranks_per_node 2 is one node at world 2 (the 'world' case)")
    per_node = world if per_node == "world" else per_node
    why = _runnable(world)
    if why:
        pytest.skip(why)
    batch, meta = _cases(world, per_node)
    from tests.test_rows import _moe_case  # examples/moe.tile with its routing tables

    inputs, moe_ref, _ = _moe_case(world, 24, 2, 16, 2, "any", seed=10)
    for schedule in ("bsp", "flags", "specialized"):
        mprog = tilec.compile("examples/moe.tile", world=world, schedule=schedule, dims={"T": 24, "K": 2},
                              backend="nvshmem", ranks_per_node=per_node, wait_timeout=30)
        batch.append((("moe", schedule, per_node), mprog, [inputs], ()))
    results = spawn(_workers.run_cases, world, backend="nvshmem", heap_bytes=1 << 26, timeout=600, args=(batch,))
    bad = [(("moe", s), r) for s in ("bsp", "flags", "specialized") for r in range(world)
           if rel_err(results[r][("moe", s, per_node)][0]["O"], moe_ref[r]) >= 2e-2]
    for key, (prog, calls) in meta.items():
        rows = compare_calls(prog, [results[r][key] for r in range(world)], calls)
        bad += [(key, r) for r in rows if not r.ok]
    assert not bad, bad[:6]
    assert {k[0] for k in meta} | {"moe"} == {p.stem for p in Path("examples").glob("*.tile")}


# the generated-program family (tests/gen_programs.py): per world, seeds of each focus ("plain": the unfocused
# family), every schedule that applies
GENERATED_SEEDS = {"plain": range(3), "ring": range(2), "push": range(2), "fixed": range(1)}


@pytest.mark.parametrize("focus", list(GENERATED_SEEDS))
@pytest.mark.parametrize("per_node", ["world", 1])
@pytest.mark.parametrize("world", [2, 4])
def test_generated_programs_on_nvshmem(world, per_node, focus):
    """Generated programs (gathers with `rank` in the index, rings, pushes, fixed ranks, several stages) under every
    schedule that applies, on one node and with one rank per "node", against the family's torch reference. One
    launch per focus, so a focus that fails or hangs leaves the others' results standing."""
    from tests.gen_programs import generate

    per_node = world if per_node == "world" else per_node
    why = _runnable(world)
    if why:
        pytest.skip(why)
    batch, meta = [], {}
    for seeds in [GENERATED_SEEDS[focus]]:
        for seed in seeds:
            g = generate(100 + seed, world, focus=True if focus == "plain" else focus)
            calls = None
            for schedule in SCHEDULES:
                try:
                    prog = tilec.compile(f"tests/generated/{g.name}.tile", world, schedule, source=g.text,
                                         backend="nvshmem", ranks_per_node=per_node, wait_timeout=30)
                except ScheduleError:
                    continue
                calls = calls or make_calls(prog, 2, seed=seed)
                key = (g.name, schedule, per_node)
                batch.append((key, prog, calls, g.plain))
                meta[key] = (g, calls)
    assert len({k[0] for k in meta}) == len(GENERATED_SEEDS[focus])
    results = spawn(_workers.run_cases, world, backend="nvshmem", heap_bytes=1 << 26, timeout=600, args=(batch,))
    bad = []
    for key, (g, calls) in meta.items():
        for c, ins in enumerate(calls):
            for r, want in enumerate(g.expect(ins)):
                for out, (value, mask) in want.items():
                    err = rel_err(results[r][key][c][out].float()[mask], value[mask])
                    if not err <= g.tol:
                        bad.append((key, r, c, out, err))
    assert not bad, bad[:6]


@pytest.mark.world(2)
def test_without_mps_is_a_clear_error():
    from tilec.runtime.launch import mps_client
    from tilec.runtime.nvshmem_heap import nvshmem_available

    if torch.cuda.device_count() >= 2 or mps_client() or not nvshmem_available():
        pytest.skip("needs one GPU, NVSHMEM, and no MPS daemon")
    with pytest.raises(Exception, match="needs MPS"):
        spawn(_workers.run_cases, 2, backend="nvshmem", heap_bytes=1 << 22, timeout=120, args=([],))


@pytest.mark.world(2)
def test_several_nodes_on_an_iris_heap_is_refused():
    from tilec.runtime.launch import mps_client

    if torch.cuda.device_count() < 2 and not mps_client():
        pytest.skip("two ranks on one GPU need MPS")
    prog = tilec.compile("examples/ag_gemm.tile", world=2, schedule="fused-push", backend="nvshmem",
                         ranks_per_node=1, dims={"M": 128, "N": 128, "K": 64})
    with pytest.raises(Exception, match="which an Iris heap cannot reach"):
        spawn(_workers.run_cases, 2, backend="iris", heap_bytes=1 << 24, timeout=120,
              args=([(("ag", 1), prog, make_calls(prog, 1, 0), ())],))


def _torchrun_tilec(world: int, *args: str, out: Path) -> subprocess.CompletedProcess:
    """`tilec ARGS` under torchrun, W rank processes on this machine (under MPS they inherit its client settings)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world),
           "-m", "tilec", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "TILEC_CACHE": str(out / "cache")})


@pytest.mark.parametrize("per_node", ["world", 1])
@pytest.mark.parametrize("world", [2, 4])
def test_run_and_bench_under_torchrun(world, per_node, tmp_path):
    """The cluster launch (torchrun, each rank builds its heap over the process group): `tilec run` matches the
    reference on rank 0 and `tilec bench` writes its rows, on one node and with one rank per "node"."""
    why = _runnable(world)
    if why:
        pytest.skip(why)
    nodes = [] if per_node == "world" else ["--ranks-per-node", str(per_node)]
    dims = ["-D", f"M={128 * world}", "-D", "N=256", "-D", "K=128"]
    res = _torchrun_tilec(world, "run", "examples/ag_gemm.tile", "--backend", "nvshmem", *nodes, *dims,
                          "--schedule", "fused-push", out=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "GPU (NVSHMEM), torchrun" in res.stdout and re.search(r"fused-push +ok: ", res.stdout), res.stdout
    res = _torchrun_tilec(world, "bench", "examples/ag_gemm.tile", "--backend", "nvshmem", *nodes, "--shapes",
                          "small", "--schedules", "bsp,fused-push", "--no-tune", "--iters", "3", "--out",
                          str(tmp_path / "bench"), out=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    rows = json.loads(next((tmp_path / "bench").glob("*.json")).read_text())["rows"]
    ours = [r for r in rows if r["kind"] == "tilec"]
    assert {r["name"] for r in ours} == {"bsp", "fused-push"}, res.stdout
    assert all(r["backend"] == "nvshmem" and r["device_us"] > 0 and r["rel_err"] < 0.02 for r in ours), ours
