"""Programs the compiler has not seen (tests/programs/*.tile), so no pass can be recognising the example: every
schedule that applies runs against torch (one spawn per world size for all of them); the ones that do not apply
raise ScheduleError with their reason."""

from __future__ import annotations

import pytest
import torch

from tests import _workers
from tests._util import (
    SCHEDULES,
    cat_shards,
    check_close,
    compile_example,
    compile_program,
    make_calls,
    program_source,
)
from tilec.errors import ScheduleError
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


# (case id, program, dims for world w, schedules, expected, dtype for the tolerance, plain-tensor arguments)
def cases(w: int):
    return [
        ("ag_gemm_k", "ag_gemm_k", None, SCHEDULES, ag_gemm_cols, "f16", ()),
        # K/W = 20 columns per rank straddle the 16-column tiles; M, N ragged too
        ("ag_gemm_k-ragged", "ag_gemm_k", {"M": 50, "N": 33, "K": 20 * w}, SCHEDULES, ag_gemm_cols, "f16", ()),
        ("chain", "chain", None, ("bsp", "flags", "fused-push"), chain, "f16", ()),
        # 9 rows per rank in 16-row tiles; B an ordinary (non-heap) tensor: it is not symmetric
        ("chain-ragged", "chain", {"M": 9 * w, "K": 24}, ("bsp", "flags", "fused-push"), chain, "f16", ("B",)),
        ("push_scale", "push_scale", {"M": 24 * w}, ("bsp", "flags"), push_scale, "f32", ()),
        ("elementwise", "elementwise", None, ("bsp", "flags"), elementwise, "f32", ()),
        ("gemm_rs", "gemm_rs", None, ("bsp",), gemm_rs, "f32", ()),
        ("place_gather", "place_gather", None, ("bsp",), place_gather, "f32", ()),
        ("rewrite", "rewrite", None, ("bsp",), rewrite, "f32", ()),
        ("ag_gemm_local", "ag_gemm_local", {"M": 32 * w}, ("bsp", "flags", "fused-pull"), ag_gemm_rows, "f16", ()),
        # other tile sizes of the example: 9 m-tiles for W = 3 (more than group_m = 8), K in one 64-wide step + a
        # ragged one; and tiles larger than the whole problem
        ("ag_gemm-small-tiles", None, {"M": 48 * w, "N": 40, "K": 72, "BM": 16, "BN": 16, "BK": 64}, SCHEDULES,
         ag_gemm_rows, "f16", ()),
        ("ag_gemm-big-tiles", None, {"M": 32 * w, "N": 64, "K": 48, "BM": 128, "BN": 128, "BK": 128}, SCHEDULES,
         ag_gemm_rows, "f16", ()),
        # bf16 (dots run in f32 on the interpreter), and the plain row-major task order (group_m=1)
        ("ag_gemm-bf16", None, {"M": 33 * w, "N": 40, "K": 48}, SCHEDULES, ag_gemm_rows, "bf16", ()),
        ("ag_gemm-ungrouped", None, {"M": 40 * w, "N": 48, "K": 32, "BM": 16, "BN": 16}, ("flags", "fused-push"),
         ag_gemm_rows, "f16", ()),
    ]


def _compile(case, program, world, schedule, dims, dtype):
    kw = {"group_m": 1} if case.endswith("-ungrouped") else {}
    if program is None:
        return compile_example(world, schedule, dims, dtype if dtype == "bf16" else "f16", **kw)
    return compile_program(program, world, schedule, dims, **kw)


ALL = [(cid, s) for cid, _p, _d, scheds, *_r in cases(2) for s in scheds]


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"w{w}")
def new_run(request):
    world = request.param
    batch, meta = [], {}
    for i, (cid, program, dims, scheds, expect, dtype, plain) in enumerate(cases(world)):
        for j, s in enumerate(scheds):
            prog = _compile(cid, program, world, s, dims, dtype)
            calls = make_calls(prog, CALLS, seed=7000 + 100 * world + 10 * i + j)
            meta[(cid, s)] = (calls, expect, dtype)
            batch.append(((cid, s), prog, calls, plain))
    results = spawn(_workers.run_cases, world, heap_bytes=1 << 24, timeout=600, args=(batch,))
    return world, meta, results


@pytest.mark.slow
@pytest.mark.parametrize("case,schedule", ALL, ids=[f"{c}-{s}" for c, s in ALL])
def test_new_program_matches_torch(new_run, case, schedule):
    world, meta, results = new_run
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

# (program, schedule, phrases the ScheduleError must contain: which schedule, which stage/tensor, why)
NOT_APPLICABLE = [
    ("chain", "fused-pull", ["fused-pull does not apply", "'gather'", "'Y'", "flags"]),
    ("push_scale", "fused-pull", ["fused-pull does not apply", "'Ag' is not a buffer written only locally by stage "
                                  "'push'"]),
    ("push_scale", "fused-push", ["fused-push does not apply", "stage 'push' does not pull from a peer chosen by a "
                                  "rank loop"]),
    ("elementwise", "fused-pull", ["fused-pull does not apply", "no stage is a pure tile copy"]),
    ("elementwise", "fused-push", ["fused-push does not apply", "no stage is a pure tile copy"]),
    ("gemm_rs", "fused-push", ["fused-push does not apply", "no stage is a pure tile copy"]),
    ("rewrite", "flags", ["replace-barriers", "'C' is written by stages 'first' and 'again'"]),
    ("rewrite", "fused-push", ["fused-push does not apply", "no stage is a pure tile copy"]),
    ("ag_gemm_local", "fused-push", ["fused-push does not apply", "'Ag' is not symmetric, so peers cannot store "
                                     "into it"]),
]


@pytest.mark.parametrize("program,schedule,why", NOT_APPLICABLE, ids=[f"{p}-{s}" for p, s, _ in NOT_APPLICABLE])
def test_schedule_does_not_apply(program, schedule, why):
    with pytest.raises(ScheduleError) as info:
        compile_program(program, 2, schedule)
    for phrase in why:
        assert phrase in str(info.value)


def test_unknown_schedule():
    with pytest.raises(ScheduleError, match=r"unknown schedule 'eager' \(choose from bsp, flags, fused-pull, "
                                            r"fused-push\)"):
        compile_example(2, "eager")


def test_check_reports_why_a_schedule_does_not_apply(capsys):
    from tests._util import PROGRAMS
    from tilec.cli import main

    assert main(["check", str(PROGRAMS / "chain.tile"), "-w", "2"]) == 0
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("  fused-pull ")]
    assert "does not apply" in line and "'Y'" in line and "verified" not in line
    assert "3 of 4 schedules verified for world 2" in out


def test_chain_graphs():
    """The three-stage chain: two flags under `flags`; one persistent kernel of three stages under fused-push."""
    from tilec.ir.graph import flags

    g = compile_program("chain", 2, "flags").graph
    assert [f.name for f in flags(g)] == ["Y.act", "Yg.gather"]
    assert [k.stages for k in g.graph["kernels"]] == [("act",), ("gather",), ("gemm",)]
    g = compile_program("chain", 2, "fused-push").graph
    assert [(k.stages, k.persistent) for k in g.graph["kernels"]] == [(("act", "gather", "gemm"), True)]


# -- bugs: compiled programs that fail ---------------------------------------------------------------------------


def _run_against_torch(progs_expect, world):
    batch, metas = [], []
    for i, (prog, expect, dtype) in enumerate(progs_expect):
        calls = make_calls(prog, CALLS, seed=9100 + i)
        batch.append((i, prog, calls, ()))
        metas.append((calls, expect, dtype))
    results = spawn(_workers.run_cases, world, heap_bytes=1 << 22, timeout=300, args=(batch,))
    for i, (calls, expect, dtype) in enumerate(metas):
        for c, ins in enumerate(calls):
            for r in range(world):
                for name, want in expect(ins, r).items():
                    check_close(results[r][i][c][name], want, dtype, f"case {i} call {c + 1} rank {r} {name}")


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="BUG codegen/emit.py _Emitter.wait (~line 283): a wait whose read is on a "
                                       "peer chosen by a `sum r in ranks` variable is hoisted out of the r loop (only "
                                       "index vars count as dependencies, not read.rank), so the kernel uses r before "
                                       "it is bound: InterpreterError UnboundLocalError 'r'")
def test_sum_over_ranks_with_flags():
    _run_against_torch([(compile_program("gemm_rs", 2, "flags"), gemm_rs, "f32")], 2)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="BUG passes/replace_barriers.py _flag: a local write indexed by `rank` "
                                       "(S[rank*M + m, n]) keys the flag on `rank`, so counters for other ranks' "
                                       "blocks exist on every rank but are never released; the verifier rejects "
                                       "the legal program (VerifyError 'missing release') instead of compiling it")
def test_flags_for_a_write_indexed_by_rank():
    _run_against_torch([(compile_program("place_gather", 2, "flags"), place_gather, "f32")], 2)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="BUG ir/tiling.py DimInverse.lin / passes/verify.py _coverage (~line 190): "
                                       "with granularity rank or tensor a flag dim has no key var, lin() returns the "
                                       "int 0 and `lins.min()` raises AttributeError (tilec check --granularity rank "
                                       "prints a traceback)")
@pytest.mark.parametrize("granularity", ["rank", "tensor"])
def test_flag_granularities(granularity):
    dims = {"M": 66, "N": 40, "K": 40}
    progs = [(compile_example(2, s, dims, granularity=granularity), ag_gemm_rows, "f16")
             for s in ("flags", "fused-push")]
    progs.append((compile_program("chain", 2, "fused-push", granularity=granularity), chain, "f16"))
    _run_against_torch(progs, 2)


@pytest.mark.xfail(strict=True, reason="BUG frontend/sema.py: an in-place stage (C[m, n] = C[m, n] * 3) passes the "
                                       "semantic checks, then the verifier rejects it after 'lower' (VerifyError "
                                       "'reads C, which it writes itself', no source location) in every schedule")
def test_in_place_update_is_a_located_compile_error():
    import tilec
    from tilec.errors import CompileError

    src = program_source("rewrite").replace("X[m, n] * 3", "C[m, n] * 3")
    with pytest.raises(CompileError) as info:
        tilec.compile("rewrite.tile", world=2, schedule="bsp", source=src)
    assert info.value.diagnostics[0].loc.line > 0
