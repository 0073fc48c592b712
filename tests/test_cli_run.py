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
