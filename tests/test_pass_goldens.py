"""The graph after every pass of every schedule, for the examples besides ag_gemm (test_printer_codegen has it):
a change in a pass shows up as a readable diff of tests/golden/<example>_w2/<schedule>.<pass>.txt
(`pytest --update-golden` rewrites them)."""

from __future__ import annotations

import pytest

import tilec
from tests._util import ROOT
from tilec.errors import ScheduleError
from tilec.passes.schedules import SCHEDULES

EXAMPLES = ("gemm_rs", "gemm_ar", "flash_decode", "flash_decode_splits")
NOT_APPLICABLE = {(e, "fused-pull") for e in EXAMPLES}  # no stage is a copy of a symmetric input


def _compile(example: str, schedule: str):
    path = ROOT / "examples" / f"{example}.tile"
    return tilec.compile(f"examples/{example}.tile", world=2, schedule=schedule, source=path.read_text())


CASES = [(e, s) for e in EXAMPLES for s in SCHEDULES]


@pytest.mark.parametrize("example,schedule", CASES, ids=[f"{e}-{s}" for e, s in CASES])
def test_graph_after_every_pass(example, schedule, golden):
    if (example, schedule) in NOT_APPLICABLE:
        with pytest.raises(ScheduleError, match="does not apply"):
            _compile(example, schedule)
        return
    prog = _compile(example, schedule)
    assert list(prog.snapshots)[0] == "lower"
    for after in prog.snapshots:
        golden(f"{example}_w2/{schedule}.{after}.txt", prog.show(after))
