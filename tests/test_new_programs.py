"""Programs the compiler has not seen (tests/programs/*.tile), so no pass can be recognising the example: every
schedule that applies runs against torch (one spawn per world size for all of them); the ones that do not apply
raise ScheduleError with their reason."""

from __future__ import annotations

import pytest
import torch

import tilec
from tests import _workers
from tests._util import (
    ROOT,
    SCHEDULES,
    cat_shards,
    check_close,
    compile_example,
    compile_program,
    make_calls,
    program_source,
)
from tilec.errors import ScheduleError
from tilec.ir.graph import state_of
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

CALLS = 2
WORLDS = (2, 3)


# -- what each program computes, in torch (f32), from the inputs of every rank of one call -------------------------


def ag_gemm_rows(ins, r):
    return {"C": cat_shards(ins, "A") @ ins[r]["B"].float()}


def ag_gemm_cols(ins, r):
    return {"C": cat_shards(ins, "A", dim=1) @ ins[r]["B"].float()}


def chain(ins, r):
    return {"C": torch.relu(cat_shards(ins, "X")) @ ins[r]["B"].float()}


def push_scale(ins, r):
    return {"C": cat_shards(ins, "A") * 2 + 1}


def elementwise(ins, r):
    x, v = ins[r]["X"].float(), ins[r]["v"].float()
    y = torch.maximum(x, v) - 1
    t = torch.exp(x * 0.5)
    z = torch.sigmoid(y) + torch.nn.functional.silu(x) * torch.tanh(t) - torch.abs(-x) / torch.sqrt(t) + \
        torch.log(t) + torch.minimum(x, torch.tensor(0.25))
    return {"Y": y, "Z": z}


def gemm_rs(ins, r):
    return {"C": sum(d["A"].float() @ d["B"].float() for d in ins)}


def place_gather(ins, r):
    return {"G": cat_shards(ins, "X")}


def rewrite(ins, r):
    return {"C": ins[r]["X"].float() * 3}


def all_to_all(ins, r):
    rows = ins[r]["X"].shape[0] // len(ins)
    return {"C": torch.cat([d["X"].float()[r * rows:(r + 1) * rows] for d in ins]) * 2 + 1}


def all_to_all_offset(ins, r):
    rows = ins[r]["X"].shape[0] - len(ins) + 1
    y = torch.cat([d["X"].float()[r:r + rows] for d in ins])
    return {"C": torch.relu(y) - y * 0.5}


def _partial_sum(ins):
    return sum(d["A"].float() @ d["B"].float() for d in ins)


def example_gemm_rs(ins, r):
    """examples/gemm_rs.tile: rank r's rows of the sum of every rank's A @ B."""
    full = _partial_sum(ins)
    rows = full.shape[0] // len(ins)
    return {"C": full[r * rows:(r + 1) * rows]}


def example_gemm_ar(ins, r):
    return {"C": _partial_sum(ins)}


# (program, schedule) pairs that do not apply, and phrases their ScheduleError must contain (which schedule, which
# stage or tensor, why). Every other pair must compile and match torch.
NOT_APPLICABLE = {
    ("chain", "fused-pull"): ["fused-pull does not apply", "'gather'", "'Y'"],
    ("push_scale", "fused-pull"): ["fused-pull does not apply", "'Ag' is not a buffer written only locally by stage "
                                   "'push' (tests/programs/push_scale.tile:10:9)"],
    ("elementwise", "fused-pull"): ["fused-pull does not apply", "no stage is a pure tile copy"],
    ("elementwise", "fused-push"): ["fused-push does not apply", "no stage is a pure tile copy"],
    ("elementwise", "specialized"): ["specialized does not apply", "data-movement stage"],
    ("gemm_rs", "fused-pull"): ["fused-pull does not apply", "no stage is a pure tile copy"],
    ("gemm_rs", "fused-push"): ["fused-push does not apply", "no stage is a pure tile copy"],
    ("place_gather", "fused-pull"): ["fused-pull does not apply", "'X' is not symmetric"],
    ("place_gather", "fused-push"): ["fused-push does not apply", "stage 'place'"],
    ("place_gather", "specialized"): ["specialized does not apply", "data-movement stage"],
    ("place_gather_sym", "fused-push"): ["fused-push does not apply", "stage 'place'"],
    ("place_gather_sym", "specialized"): ["specialized does not apply", "data-movement stage"],
    ("rewrite", "flags"): ["replace-barriers", "'C' is written by stages 'first' and 'again'"],
    ("rewrite", "fused-pull"): ["fused-pull does not apply", "no stage is a pure tile copy"],
    ("rewrite", "fused-push"): ["fused-push does not apply", "no stage is a pure tile copy"],
    ("rewrite", "specialized"): ["'C' is written by stages 'first' and 'again'"],
    ("ag_gemm_local", "fused-push"): ["fused-push does not apply", "'Ag' is not symmetric, so peers cannot store into "
                                      "it (stage 'gather', tests/programs/ag_gemm_local.tile:11:9)"],
    ("examples/gemm_rs", "fused-pull"): ["fused-pull does not apply", "no stage is a pure tile copy"],
    ("examples/gemm_ar", "fused-pull"): ["fused-pull does not apply", "stage 'gather' (examples/gemm_ar.tile:20:9) "
                                         "copies 'Cs', which the program computes"],
}


# (case id, program (None: examples/ag_gemm.tile), dims for world w, expected, dtype for the tolerance,
#  plain-tensor arguments, compile options)
def cases(w: int):
    return [
        ("ag_gemm_k", "ag_gemm_k", {"M": 64, "N": 48, "K": 48}, ag_gemm_cols, "f16", (), {}),
        # K/W = 20 columns per rank straddle the 16-column tiles; M, N ragged too
        ("ag_gemm_k-ragged", "ag_gemm_k", {"M": 50, "N": 33, "K": 20 * w}, ag_gemm_cols, "f16", (), {}),
        ("chain", "chain", {"M": 24 * w}, chain, "f16", (), {}),
        # 9 rows per rank in 16-row tiles; B an ordinary (non-heap) tensor: it is not symmetric
        ("chain-ragged", "chain", {"M": 9 * w, "K": 24}, chain, "f16", ("B",), {}),
        ("push_scale", "push_scale", {"M": 24 * w, "K": 24}, push_scale, "f32", (), {}),
        ("elementwise", "elementwise", None, elementwise, "f32", (), {}),
        ("gemm_rs", "gemm_rs", None, gemm_rs, "f32", (), {}),
        ("place_gather", "place_gather", None, place_gather, "f32", (), {}),
        ("place_gather_sym", "place_gather_sym", None, place_gather, "f32", (), {}),
        ("rewrite", "rewrite", None, rewrite, "f32", (), {}),
        # a bug once: fused-pull took `rank` in a copy's source index as 0 (wrong on every rank but 0); ragged tiles
        ("all_to_all", "all_to_all", {"M": 20 * w}, all_to_all, "f32", (), {}),
        ("all_to_all_offset", "all_to_all_offset", {"R": 9}, all_to_all_offset, "f32", (), {}),
        ("ag_gemm_local", "ag_gemm_local", {"M": 32 * w}, ag_gemm_rows, "f16", (), {}),
        # other tile sizes of the example: 9 m-tiles for W = 3 (more than group_m = 8), K in one 64-wide step + a
        # ragged one; and tiles larger than the whole problem
        ("ag_gemm-small-tiles", None, {"M": 48 * w, "N": 40, "K": 72, "BM": 16, "BN": 32, "BK": 64}, ag_gemm_rows,
         "f16", (), {}),
        # more than 8 m-tiles (group_m) at every world, ragged: a partial last group of rows, and two groups
        ("ag_gemm-grouped-ragged", None, {"M": 70 * w, "N": 40, "K": 32, "BM": 16, "BN": 16, "BK": 32}, ag_gemm_rows,
         "f16", (), {}),
        ("ag_gemm-grouped-17", None, {"M": 68 * w, "N": 24, "K": 16, "BM": 8, "BN": 16, "BK": 16}, ag_gemm_rows,
         "f16", (), {}),
        # GEMM + Reduce-Scatter / All-Reduce with every size ragged against its tiles (33 rows and 15 k per rank)
        *[(f"{e}-ragged", f"examples/{e}", {"M": 33 * w, "N": 40, "K": 15 * w, "BM": 16, "BN": 32, "BK": 16}, f,
           "f16", (), {}) for e, f in (("gemm_rs", example_gemm_rs), ("gemm_ar", example_gemm_ar))],
        ("ag_gemm-big-tiles", None, {"M": 32 * w, "N": 64, "K": 48, "BM": 128, "BN": 128, "BK": 128}, ag_gemm_rows,
         "f16", (), {}),
        # bf16 (dots run in f32 on the interpreter), and the plain row-major task order (group_m=1)
        ("ag_gemm-bf16", None, {"M": 33 * w, "N": 40, "K": 48}, ag_gemm_rows, "bf16", (), {}),
        ("ag_gemm-ungrouped", None, {"M": 24 * w, "N": 32, "K": 32, "BM": 16, "BN": 16}, ag_gemm_rows, "f16", (),
         {"group_m": 1}),
        # every flag granularity (a counter per tile, per source rank, one per tensor)
        *[(f"ag_gemm-{g}-flags", None, {"M": 22 * w, "N": 40, "K": 40}, ag_gemm_rows, "f16", (), {"granularity": g})
          for g in ("tile", "rank", "tensor")],
        *[(f"chain-{g}-flags", "chain", {"M": 8 * w, "K": 24}, chain, "f16", (), {"granularity": g})
          for g in ("tile", "rank", "tensor")],
    ]


def schedules_of(program) -> list[str]:
    return [s for s in SCHEDULES if ((program or "ag_gemm"), s) not in NOT_APPLICABLE]


def _compile(program, world, schedule, dims=None, dtype="f16", kw=None):
    """program None: examples/ag_gemm.tile; "examples/NAME": that example; else tests/programs/NAME.tile."""
    kw = kw or {}
    if program is None:
        return compile_example(world, schedule, dims, dtype if dtype == "bf16" else "f16", **kw)
    if program.startswith("examples/"):
        return tilec.compile(f"{program}.tile", world=world, schedule=schedule, dims=dims,
                             source=(ROOT / f"{program}.tile").read_text(), **kw)
    return compile_program(program, world, schedule, dims, **kw)


def _granular(kw) -> bool:
    return "granularity" in kw


ALL = [(cid, s) for cid, program, _d, _e, _t, _p, kw in cases(2) for s in schedules_of(program)
       if not _granular(kw) or s != "bsp"]


def _run(world: int, only: tuple[str, ...] | None = None):
    """Compile every applicable (case, schedule) for this world (the cases in `only`, if given) and run them all
    in one spawn."""
    batch, meta = [], {}
    for i, (cid, program, dims, expect, dtype, plain, kw) in enumerate(cases(world)):
        if only is not None and cid not in only:
            continue
        for j, s in enumerate(schedules_of(program)):
            if _granular(kw) and s == "bsp":
                continue
            try:
                prog = _compile(program, world, s, dims, dtype, kw)
            except Exception as e:  # reported by that case's test; the others still run
                meta[(cid, s)] = e
                continue
            calls = make_calls(prog, CALLS, seed=7000 + 100 * world + 10 * i + j)
            meta[(cid, s)] = (calls, expect, dtype)
            batch.append(((cid, s), prog, calls, plain))
    results = spawn(_workers.run_cases, world, heap_bytes=1 << 24, timeout=600, args=(batch,))
    return world, meta, results


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"w{w}")
def new_run(request):
    return _run(request.param)


# a few programs at one rank and at more than four (every rank loop of one trip; five ranks' shards)
OTHER_WORLDS = (1, 5)
FEW = ("chain-ragged", "push_scale", "gemm_rs", "place_gather_sym", "gemm_rs-ragged", "ag_gemm-grouped-ragged",
       "all_to_all_offset")
FEW_ALL = [(cid, s) for cid, program, _d, _e, _t, _p, _kw in cases(2) if cid in FEW for s in schedules_of(program)]


@pytest.fixture(scope="module", params=OTHER_WORLDS, ids=lambda w: f"w{w}")
def few_run(request):
    return _run(request.param, FEW)


@pytest.mark.slow
@pytest.mark.parametrize("case,schedule", FEW_ALL, ids=[f"{c}-{s}" for c, s in FEW_ALL])
def test_few_programs_at_other_worlds_match_torch(few_run, case, schedule):
    _check(few_run, case, schedule)


@pytest.mark.slow
@pytest.mark.parametrize("case,schedule", ALL, ids=[f"{c}-{s}" for c, s in ALL])
def test_new_program_matches_torch(new_run, case, schedule):
    _check(new_run, case, schedule)


def _check(run, case, schedule):
    world, meta, results = run
    if isinstance(meta[(case, schedule)], Exception):
        raise meta[(case, schedule)]
    calls, expect, dtype = meta[(case, schedule)]
    for i, ins in enumerate(calls):
        for r in range(world):
            want = expect(ins, r)
            got = results[r][(case, schedule)][i]
            assert set(got) == set(want)
            for name in want:
                check_close(got[name], want[name], dtype, f"{case} {schedule} world {world} rank {r} call {i + 1} "
                                                          f"{name}")


# -- schedules that do not apply say why ----------------------------------------------------------------------------


@pytest.mark.parametrize("program,schedule", list(NOT_APPLICABLE), ids=[f"{p}-{s}" for p, s in NOT_APPLICABLE])
def test_schedule_does_not_apply(program, schedule):
    with pytest.raises(ScheduleError) as info:
        _compile(program, 2, schedule)
    for phrase in NOT_APPLICABLE[(program, schedule)]:
        assert phrase in str(info.value)


def test_unknown_schedule():
    with pytest.raises(ScheduleError) as info:
        compile_example(2, "eager")
    assert str(info.value).startswith("unknown schedule 'eager' (choose from ")
    for s in SCHEDULES:
        assert s in str(info.value)


def test_check_reports_why_a_schedule_does_not_apply(capsys):
    from tests._util import PROGRAMS
    from tilec.cli import main

    assert main(["check", str(PROGRAMS / "chain.tile"), "-w", "2"]) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("  fused-pull ")]
    assert "does not apply" in line and "'Y'" in line and "verified" not in line
    n = len(SCHEDULES)
    assert f"{n - 1} of {n} schedules verified for world 2" in out


def test_chain_graphs():
    """The three-stage chain: two flags under `flags`; one persistent kernel of three stages under fused-push."""
    from tilec.ir.graph import flags

    g = compile_program("chain", 2, "flags").graph
    assert [f.name for f in flags(g)] == ["Y.act", "Yg.gather"]
    assert [k.stages for k in state_of(g).kernels] == [("act",), ("gather",), ("gemm",)]
    g = compile_program("chain", 2, "fused-push").graph
    assert [(k.stages, k.persistent) for k in state_of(g).kernels] == [(("act", "gather", "gemm"), True)]


# -- bugs ------------------------------------------------------------------------------------------------------


def test_in_place_update_is_a_located_compile_error():
    import tilec
    from tilec.errors import CompileError

    src = program_source("rewrite").replace("X[m, n] * 3", "C[m, n] * 3")
    with pytest.raises(CompileError) as info:
        tilec.compile("rewrite.tile", world=2, schedule="bsp", source=src)
    assert info.value.diagnostics[0].loc.line > 0


def test_fused_pull_needs_a_symmetric_source():
    with pytest.raises(ScheduleError, match="symmetric"):
        compile_program("place_gather", 2, "fused-pull")


def test_fused_pull_of_a_rank_placed_copy_ends_with_a_barrier():
    prog = compile_program("place_gather_sym", 3, "fused-pull")
    assert "pull(X[m, n] via S@r" in prog.show()
    assert prog.module.EXIT_BARRIER is True
