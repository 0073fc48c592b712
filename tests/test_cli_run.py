"""`tilec run` end to end on the CPU emulation: compile, spawn, compare with the reference (exit code 0, "ok")."""

from __future__ import annotations

import pytest

from tests._util import ROOT
from tilec.cli import main


@pytest.mark.slow
def test_tilec_run_one_schedule(capsys, monkeypatch, no_shm_leftovers):
    monkeypatch.chdir(ROOT)
    rc = main(["run", "examples/ag_gemm.tile", "--world", "2", "-s", "fused-push", "--repeat", "2",
               "-D", "M=66", "-D", "N=40", "-D", "K=40"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "world 2, CPU emulation" in out and "fused-push  ok:" in out and "MISMATCH" not in out
    assert "2 call(s) per schedule" in out and "over 4 output(s)" in out  # 2 calls x 2 ranks, each compared


def test_every_call_of_tilec_run_gets_new_inputs():
    """--repeat N: each call's inputs differ from the last's (an output left by the previous call cannot pass)."""
    import torch

    from tests._util import compile_example
    from tilec.run_vs_reference import call_inputs

    prog = compile_example(2, "bsp", {"M": 64, "N": 32, "K": 32})
    calls = call_inputs(prog, 3)
    for c in range(1, 3):
        for r in range(2):
            assert all(not torch.equal(calls[c][r][n], calls[c - 1][r][n]) for n in calls[c][r])
