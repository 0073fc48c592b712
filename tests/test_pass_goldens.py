"""The graph after every pass of every schedule, for the examples besides ag_gemm (test_printer_codegen has it):
a change in a pass shows up as a readable diff of tests/golden/<example>_w2/<schedule>.<pass>.txt
(`pytest --update-golden` rewrites them)."""

from __future__ import annotations

import pytest

import tilec
from tests._util import ROOT
from tilec.errors import ScheduleError
from tilec.ir.graph import state_of
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


def test_lower_is_a_pass_the_pipeline_runs_first():
    """lower takes the program's graph (no nodes yet) to the tile graph like any pass: on a copy, its name appended
    to the passes, the verifier run after it."""
    from tilec.errors import TilecError
    from tilec.frontend.parser import parse
    from tilec.frontend.sema import check
    from tilec.ir.graph import stages
    from tilec.passes.base import Pass, run_pipeline
    from tilec.passes.lower import Lower, program_graph

    bound = check(parse((ROOT / "examples" / "gemm_rs.tile").read_text(), "gemm_rs.tile"), 2)
    g0 = program_graph(bound)
    g = Lower()(g0)
    assert isinstance(Lower(), Pass) and g0.number_of_nodes() == 0 and state_of(g).passes == ("lower",)
    assert [s.name for s in stages(g)] == [it.name for it in bound.items if hasattr(it, "loops")]
    assert state_of(Lower()(bound)).order == state_of(g).order
    with pytest.raises(TilecError, match="lowered already"):
        Lower()(g)
    seen = []
    run_pipeline(program_graph(bound), [Lower()], lambda h, name: seen.append((name, h.number_of_nodes())))
    assert seen == [("lower", g.number_of_nodes())]
