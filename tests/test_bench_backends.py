"""Backends in the bench and in `--schedule auto`: `tilec bench --backend nvshmem` / `--ranks-per-node` compiles
backend nvshmem's kernels and records their times apart from Iris's; several backends in one run stand side by side;
auto runs Iris's kernels where the bench measured NVSHMEM slower on one node, and says so."""

from __future__ import annotations

import json

import pytest

import tilec
from tests._util import ROOT
from tilec.cli.commands import main
from tilec.errors import TilecError
from tilec.perf import auto, bench

GEMM = str(ROOT / "examples" / "ag_gemm.tile")
DIMS = {"M": 128, "N": 128, "K": 64}


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    """A cache of this test's own: auto.json's measured times are read by every later `--schedule auto`."""
    monkeypatch.setenv("TILEC_CACHE", str(tmp_path / "cache"))
    return tmp_path


def test_bench_runs_nvshmem_kernels_across_nodes_on_the_cpu(own_cache, monkeypatch):
    """World 2, one rank per "node": every peer is reached by the off-node path (gets, puts, signals on the CPU
    emulation's heap); each output against torch, the times recorded under the nvshmem key only."""
    monkeypatch.setitem(bench.SHAPES, "small", [(128, 128, 64)])
    rows = bench.run_bench(GEMM, 2, "small", ["flags", "fused-push"], "f16", 1, False, str(own_cache), "cpu", 1)
    mine = [r for r in rows if r["kind"] == "tilec"]
    assert [r["name"] for r in mine] == ["flags", "fused-push"]
    assert all(r["kernels"] == "nvshmem" and r["ranks_per_node"] == 1 and r["backend"] == "cpu" for r in mine)
    assert all(r["rel_err"] is not None and r["rel_err"] < 2e-2 for r in mine), mine
    src = open(GEMM).read()
    nv = json.loads((own_cache / "cache" / "auto.json").read_text())
    across = auto.key(src, 2, DIMS, auto.CPU_KEY, kernels={"backend": "nvshmem", "ranks_per_node": 1})
    assert across.endswith("|nvshmem/rpn=1") and set(nv[across]["measured"]) == {"flags", "fused-push"}
    assert "measured" not in nv.get(auto.key(src, 2, DIMS, auto.CPU_KEY), {})  # Iris's times untouched
    assert json.loads((own_cache / "ag_gemm_small_f16.json").read_text())["meta"]["backend"] == "cpu"


def test_rows_of_several_backends_side_by_side():
    def rows(be_us):
        return [{"shape": {"M": m}, "name": n, "kind": k, "device_us": be_us}
                for m in (1, 2) for n, k in (("cublas", "baseline"), ("flags", "tilec"), ("bsp", "tilec"))]

    out = bench.side_by_side({"iris": rows(1.0), "nvshmem": rows(2.0)})
    assert [(r["shape"]["M"], r["name"]) for r in out] == [
        (1, "cublas"), (1, "flags [iris]"), (1, "bsp [iris]"), (1, "flags [nvshmem]"), (1, "bsp [nvshmem]"),
        (2, "cublas"), (2, "flags [iris]"), (2, "bsp [iris]"), (2, "flags [nvshmem]"), (2, "bsp [nvshmem]")]
    assert all(r["device_us"] == 1.0 for r in out if r["kind"] == "baseline")  # the first run's baselines, once
    assert {r["kernels"] for r in out if r["name"].endswith("[nvshmem]")} == {"nvshmem"}
    assert bench.not_run(["flags", "bsp", "fused-push"], out) == ["fused-push"]
    one = bench.side_by_side({"iris": rows(1.0)})
    assert [r["name"] for r in one][:3] == ["cublas", "flags", "bsp"] and one[1]["kernels"] == "iris"


@pytest.mark.parametrize("text, torchrun, says", [
    ("iris,iris", False, "each once"), ("iris,mpi", False, "choose one or more of cpu, iris, nvshmem"),
    ("iris,nvshmem", True, "under torchrun each rank holds one heap")])
def test_bad_backend_lists_name_the_argument(text, torchrun, says):
    with pytest.raises(TilecError, match=says):
        bench.backend_list(text, torchrun)
    assert bench.backend_list("iris,nvshmem", False) == ["iris", "nvshmem"]


def test_bad_ranks_per_node_is_refused_before_any_rank_starts(own_cache):
    with pytest.raises(TilecError, match=r"--ranks-per-node 3: must divide the world \(2\)"):
        bench.run_bench(GEMM, 2, "small", ["flags"], "f16", 1, False, str(own_cache), "cpu", 3)
    with pytest.raises(TilecError, match=r"--ranks-per-node 1 with --backend iris,nvshmem: an Iris heap"):
        bench.run_bench(GEMM, 2, "small", ["flags"], "f16", 1, False, str(own_cache), "iris,nvshmem", 1)


def _measure(src, times: dict, kernels=None):
    k = auto.key(src, 2, DIMS, kernels=kernels)
    for variant, us in times.items():
        auto.record_measured(k, variant, us)


NV = {"backend": "nvshmem", "ranks_per_node": None}


@pytest.mark.parametrize("iris_us, nv_us, picks_iris", [(100.0, 140.0, True), (150.0, 140.0, False)])
def test_auto_runs_iris_where_nvshmem_on_one_node_measured_slower(own_cache, capsys, iris_us, nv_us, picks_iris):
    src = open(GEMM).read()
    _measure(src, {"flags": iris_us, "bsp": 400.0})
    _measure(src, {"flags": nv_us, "bsp": 410.0}, NV)
    prog = auto.compile_auto(GEMM, 2, DIMS, backend="nvshmem")
    assert prog.options.backend == ("iris" if picks_iris else "nvshmem")
    assert (prog.backend_note is not None) == picks_iris
    if picks_iris:
        assert f"measured {nv_us:.0f} us (flags)" in prog.backend_note and f"Iris {iris_us:.0f} us" in prog.backend_note
    assert main(["compile", GEMM, "--world", "2", "-D", "M=128", "-D", "N=128", "-D", "K=64", "--backend", "nvshmem",
                 "-o", str(own_cache / "out.py")]) == 0
    err = capsys.readouterr().err
    assert ("running Iris's kernels" in err) == picks_iris, err
    assert ('BACKEND = "nvshmem"' in (own_cache / "out.py").read_text()) != picks_iris


def test_auto_keeps_nvshmem_across_nodes_and_without_both_measurements(own_cache):
    src = open(GEMM).read()
    _measure(src, {"flags": 100.0})
    assert auto.backend_pick(src, 2, DIMS, NV) == (NV, None)  # nothing measured on NVSHMEM
    _measure(src, {"flags": 300.0}, {"backend": "nvshmem", "ranks_per_node": 1})
    across = {"backend": "nvshmem", "ranks_per_node": 1}
    assert auto.backend_pick(src, 2, DIMS, across) == (across, None)  # only NVSHMEM reaches another node
    prog = auto.compile_auto(GEMM, 2, DIMS, backend="nvshmem", ranks_per_node=1)
    assert prog.options.backend == "nvshmem" and prog.backend_note is None
    assert tilec.compile(GEMM, 2, "flags", DIMS, backend="nvshmem").options.backend == "nvshmem"  # named: as asked
