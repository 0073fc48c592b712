"""`tilec tune`: short timed trials of every legal schedule feed `--schedule auto` (CPU emulation, 2 ranks)."""

import json

import pytest

from tilec.cli import main as cli_main
from tilec.perf.auto import candidates, compile_auto, variant_of
from tilec.perf.trials import _spawned
from tilec.runtime import spawn

AG = "examples/ag_gemm.tile"
DIMS = {"M": 64, "N": 64, "K": 32}


@pytest.mark.slow
def test_trials_agree_across_ranks_and_steer_auto(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEC_CACHE", str(tmp_path))
    per_rank = spawn(_spawned, 2, backend="cpu", heap_bytes=1 << 24, timeout=600,
                     args=(AG, DIMS, 1, 0, "auto", None))
    assert per_rank[0] == per_rank[1]  # the slowest rank's time is kept, so both ranks rank alike
    trials = per_rank[0]
    legal = {r["schedule"] for r in candidates(AG, open(AG).read(), 2, DIMS, DIMS)}
    assert {t.schedule for t in trials} == legal
    times = [t.measured_us for t in trials]
    assert all(x is not None and x > 0 for x in times) and times == sorted(times)
    recorded = next(iter(json.loads((tmp_path / "auto.json").read_text()).values()))["measured"]
    assert recorded == pytest.approx({t.schedule: t.measured_us for t in trials}, abs=0.01)
    # every legal schedule measured: auto now follows the measurements, not the model
    assert variant_of(compile_auto(AG, 2, DIMS)) == trials[0].schedule  # e.g. flags+dma


def test_tune_cli_reports_the_pick(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TILEC_CACHE", str(tmp_path))
    assert cli_main(["tune", AG, "--world", "1", "-D", "M=32", "-D", "N=32", "-D", "K=32", "--iters", "1",
                     "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "CPU emulation" in out and "fastest measured:" in out
    picked = out.split("fastest measured: ")[1].split(" ")[0]
    assert variant_of(compile_auto(AG, 1, {"M": 32, "N": 32, "K": 32})) == picked


@pytest.mark.slow  # a multi-rank run of many seconds: not in the quick selection
def test_run_auto_times_the_candidates_when_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TILEC_CACHE", str(tmp_path))
    argv = ["run", AG, "--world", "1", "-D", "M=32", "-D", "N=32", "-D", "K=32", "--backend", "cpu", "-s", "auto"]
    assert cli_main([*argv, "--trials"]) == 0
    out = capsys.readouterr().out
    assert "timing" in out and "tilec tune" in out
    ran = [ln.split()[0] for ln in out.splitlines() if " ok:" in ln]
    assert ran == [variant_of(compile_auto(AG, 1, {"M": 32, "N": 32, "K": 32}))]  # the measured pick
    assert cli_main(argv) == 0  # measured now: no second round of trials
    assert "timing" not in capsys.readouterr().out


@pytest.mark.slow
def test_tune_across_nodes_times_nvshmem_kernels_and_keeps_them_apart(tmp_path, monkeypatch, capsys):
    """`tilec tune --ranks-per-node 1` times backend nvshmem's kernels (off-node gets and puts on the CPU emulation)
    and records them under their own key: Iris's key stays empty, and auto across nodes reads them."""
    from tilec.perf.auto import CPU_KEY, key

    monkeypatch.setenv("TILEC_CACHE", str(tmp_path))
    assert cli_main(["tune", AG, "--world", "2", "-D", "M=64", "-D", "N=64", "-D", "K=32", "--iters", "1",
                     "--backend", "cpu", "--ranks-per-node", "1"]) == 0
    picked = capsys.readouterr().out.split("fastest measured: ")[1].split(" ")[0]
    saved = json.loads((tmp_path / "auto.json").read_text())
    src = open(AG).read()
    across = saved[key(src, 2, DIMS, CPU_KEY, kernels={"backend": "nvshmem", "ranks_per_node": 1})]["measured"]
    assert picked in across and "measured" not in saved.get(key(src, 2, DIMS, CPU_KEY), {})
    rows = candidates(AG, src, 2, DIMS, DIMS, device=CPU_KEY, kernels={"backend": "nvshmem", "ranks_per_node": 1})
    assert all(r["measured_us"] is not None for r in rows) and rows[0]["schedule"] == picked


def test_tune_with_compile_options_keeps_their_times_apart(tmp_path, monkeypatch, capsys):
    """`tilec tune --fold off --wait-timeout 9` builds every variant with those options and records their times
    under a key of their own: the default program's key stays empty, and auto reads them only with those options."""
    from tilec.perf.auto import CPU_KEY, key
    from tilec.settings import options

    monkeypatch.setenv("TILEC_CACHE", str(tmp_path))
    dims = {"M": 32, "N": 32, "K": 32}
    assert cli_main(["tune", AG, "--world", "1", *(x for d, v in dims.items() for x in ("-D", f"{d}={v}")),
                     "--iters", "1", "--backend", "cpu", "--fold", "off", "--wait-timeout", "9"]) == 0
    out = capsys.readouterr().out
    assert "timed calls each; built with --fold off --wait-timeout 9\n" in out  # the header says so
    picked = out.split("fastest measured: ")[1].split(" ")[0]
    saved = json.loads((tmp_path / "auto.json").read_text())
    src = open(AG).read()
    given = {"fold": False, "wait_timeout": 9.0}
    mine = saved[key(src, 1, dims, CPU_KEY, options=options(**given))]["measured"]
    assert picked in mine and "measured" not in saved.get(key(src, 1, dims, CPU_KEY), {})
    rows = candidates(AG, src, 1, dims, dims, device=CPU_KEY, kernels=given)
    assert all(r["measured_us"] is not None for r in rows) and rows[0]["schedule"] == picked
    prog = compile_auto(AG, 1, dims, **given)
    assert variant_of(prog) == picked and not prog.options.fold and prog.wait_timeout == 9.0
