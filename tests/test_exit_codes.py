"""One rule for exit codes, every subcommand (tilec.cli.EXIT_CODES, in `tilec --help`): 0 everything asked for
succeeded, 1 a wrong result was found (run MISMATCH, check: verifier rejection or a pass failing), 2 the request
could not be carried out (usage, bad program, a schedule named explicitly that does not apply, runtime errors).
Also: --repeat/--iters must be positive; outputs equal to inf / -inf on both sides, and NaN where the reference
has NaN, are not a mismatch."""

from __future__ import annotations

import math

import pytest
import torch

from tests._util import ROOT
from tilec import run_vs_reference as run_mod
from tilec.cli import EXIT_CODES, main
from tilec.errors import VerifyError
from tilec.run_vs_reference import output_error

SMALL = ["-D", "M=64", "-D", "N=32", "-D", "K=32"]

OVERFLOW = """program overflow(world W)
  dims  M = 16, N = 16
  tiles BM = 16, BN = 16

  in  X : f16[M, N]
  out Y : f16[M, N]
  out Z : f32[M, N]

  stage s over m in M by BM, n in N by BN:
    Y[m, n] = X[m, n] * 70000.0
    Z[m, n] = log(X[m, n])
"""


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def _rc(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_help_states_the_rule(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert EXIT_CODES.splitlines()[0] in text
    for code in ("0  everything asked for succeeded", "1  tilec ran and found a wrong result", "2  the request"):
        assert code in text


@pytest.mark.parametrize("argv", [
    ["run", "examples/ag_gemm.tile", "--repeat", "0"],
    ["run", "examples/ag_gemm.tile", "--repeat", "-3"],
    ["run", "examples/ag_gemm.tile", "--repeat", "two"],
    ["run", "examples/ag_gemm.tile", "--heap-mb", "0"],
    ["tune", "examples/ag_gemm.tile", "--iters", "0"],
    ["bench", "examples/ag_gemm.tile", "--iters", "0"],
])
def test_counts_must_be_positive(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {argv[2]}" in err and ("must be >= 1" in err or "not an integer" in err), err


@pytest.mark.parametrize("cmd", ["compile", "show", "run", "taxes"])
def test_explicit_schedule_that_does_not_apply_is_2_everywhere(cmd, capsys):
    argv = [cmd, "examples/gemm_rs.tile", "--world", "2", "-D", "M=64", "-D", "N=32", "-D", "K=64"]
    if cmd != "taxes":
        argv += ["-s", "fused-pull"]
        rc, out, err = _rc(argv, capsys)
        assert rc == 2 and "fused-pull" in err and "skipped" not in out, (out, err)
    else:  # taxes lists every schedule; one that does not apply is information
        rc, out, err = _rc(argv, capsys)
        assert rc == 0 and "fused-pull" in out


def test_compile_show_check_succeed_with_0(capsys):
    assert _rc(["compile", "examples/ag_gemm.tile", "-s", "bsp", *SMALL], capsys)[0] == 0
    assert _rc(["show", "examples/ag_gemm.tile", "-s", "flags", *SMALL], capsys)[0] == 0
    rc, out, _ = _rc(["check", "examples/gemm_rs.tile", "--world", "2"], capsys)  # fused-pull does not apply
    assert rc == 0 and "does not apply" in out and ": ok," in out


def test_bad_program_is_2(tmp_path, capsys):
    bad = tmp_path / "bad.tile"
    bad.write_text("program p(world W)\n  dims M = 4\n  in X : f16[M\n")
    for cmd in ("compile", "show", "check", "run", "taxes"):
        rc, _out, err = _rc([cmd, str(bad)], capsys)
        assert rc == 2 and f"{bad}:" in err, (cmd, err)
    rc, _out, err = _rc(["compile", str(tmp_path / "missing.tile")], capsys)
    assert rc == 2 and "missing.tile" in err


@pytest.mark.parametrize("failure", ["verifier", "crash"])
def test_check_failing_schedules_are_1(failure, capsys, monkeypatch):
    """A schedule the verifier rejects is a rejected program (2, as sema's errors), one whose pass fails a
    failure (1); the other schedules still run."""
    import tilec.api

    real = tilec.api.verify

    def verify(g, pass_name):
        if pass_name == "replace-barriers":
            if failure == "verifier":
                raise VerifyError(pass_name, ["a wait nobody releases"])
            raise KeyError("boom")
        return real(g, pass_name)

    monkeypatch.setattr(tilec.api, "verify", verify)
    rc, out, _ = _rc(["check", "examples/ag_gemm.tile", "--world", "2"], capsys)
    assert rc == (2 if failure == "verifier" else 1), out
    assert ("REJECTED by the verifier" if failure == "verifier" else "FAILED in a pass: KeyError") in out
    assert "bsp         verified" in out  # bsp has no replace-barriers pass


def test_calibrate_without_a_gpu_is_2(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: calibrate would measure it")
    out = tmp_path / "machine.json"
    rc, _o, err = _rc(["calibrate", "-o", str(out)], capsys)
    assert rc == 2 and "none is visible" in err and not out.exists()


def test_output_error_on_non_finite_values():
    inf, nan = float("inf"), float("nan")
    want = torch.tensor([1.0, inf, -inf, nan, 2.0])
    assert output_error(want.clone(), want) == (0.0, 0.0)
    for i, bad in ((0, nan), (1, -inf), (1, 5.0), (2, inf), (3, 0.0), (4, inf), (4, nan)):
        got = want.clone()
        got[i] = bad
        assert output_error(got, want)[1] == inf, (i, bad)
    got = want.clone()
    got[4] = 2.5
    assert output_error(got, want) == (0.5, 0.25)  # the scale is the largest finite |want| (or 1)


@pytest.mark.slow
def test_run_infinities_and_nans_on_both_sides_are_ok(tmp_path, capsys, no_shm_leftovers):
    prog_path = tmp_path / "overflow.tile"
    prog_path.write_text(OVERFLOW)
    import tilec

    prog = tilec.compile(str(prog_path), world=1, schedule="bsp")
    for call in range(2):  # the inputs of both calls really overflow and really take logs of negatives
        x = run_mod.make_inputs(prog, 0, call)["X"].float()
        assert (x.abs() * 70000 > 65520).any() and (x < 0).any()
    rc, out, err = _rc(["run", str(prog_path), "-s", "bsp", "--repeat", "2"], capsys)
    assert rc == 0 and "bsp         ok:" in out and "MISMATCH" not in out, out + err


@pytest.mark.slow
def test_run_mismatch_is_1(capsys, monkeypatch, no_shm_leftovers):
    real = run_mod.evaluate

    def off_by_one(prog, inputs, device="cpu", *rest):
        return [{n: t + 1 if n == "C" else t for n, t in d.items()} for d in real(prog, inputs, device, *rest)]

    monkeypatch.setattr(run_mod, "evaluate", off_by_one)
    rc, out, _ = _rc(["run", "examples/ag_gemm.tile", "-s", "bsp", "--repeat", "1", *SMALL], capsys)
    assert rc == 1 and "bsp         MISMATCH" in out and "call 1 rank 0 C" in out, out
    assert math.isfinite(float(out.split("max error ")[1].split()[0]))


@pytest.mark.slow
def test_bench_and_calibrate_through_the_cli(tmp_path, capsys, monkeypatch):
    """`tilec bench` on the CPU: 0 with every applicable schedule timed and right; a schedule named with
    --schedules that does not apply to the program: 2 after saying so."""
    from tilec.perf import bench

    monkeypatch.setitem(bench.SHAPES, "small", [(64, 64, 64)])
    monkeypatch.setenv("TILEC_CACHE", str(tmp_path / "cache"))
    rc, _out, err = _rc(["bench", "examples/ag_gemm.tile", "--backend", "cpu", "--iters", "1", "--no-tune",
                         "--schedules", "bsp,fused-push", "--out", str(tmp_path)], capsys)
    assert rc == 0, err
    import json

    rows = json.loads((tmp_path / "ag_gemm_small_bf16.json").read_text())["rows"]
    assert [r["name"] for r in rows] == ["cublas floor", "cublas", "bsp", "fused-push"]
    assert all(r["rel_err"] is not None and r["rel_err"] < 5e-2 for r in rows if r["kind"] == "tilec")
    rc, _out, err = _rc(["bench", "examples/gemm_rs.tile", "--backend", "cpu", "--iters", "1", "--no-tune",
                         "--schedules", "fused-pull", "--out", str(tmp_path)], capsys)
    assert rc == 2 and "fused-pull did not run" in err, err
