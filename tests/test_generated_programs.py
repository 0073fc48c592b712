"""Generated programs (tests/gen_programs.py) under option combinations, worlds 1-4, against torch.

Every run draws the options together: schedule, transport, granularity, start_local, group_m, world and dtype
(gen_programs.OPTIONS). The default run is a covering array of them (gen_programs.covering): every pair of option
values, and every triple of schedule x transport x granularity and transport x granularity x world, is run at least
once, each row with a generated program it compiles (the first of a few seeds; a ScheduleError means that schedule
does not apply to that program, and the next seed is drawn), one spawn per world, two calls with different inputs
under the CPU adversary, every output element the program writes compared with the generator's torch model.
`pytest -m gen_long tests/test_generated_programs.py` runs the full product of the options (a program each) and,
as before, many programs under every schedule (TILEC_GEN_LONG per world, seeds from TILEC_GEN_SEED).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from functools import cache

import pytest
import torch

import tilec
from tests import _workers
from tests._util import SCHEDULES, make_calls
from tests.gen_programs import (
    DMA_SCHEDULES,
    OPTIONS,
    Combo,
    Frame,
    GenProgram,
    Idx,
    Invalid,
    Load,
    Node,
    Stage,
    Tensor,
    covering,
    generate,
    interactions,
    valid_combos,
)
from tilec.errors import ScheduleError
from tilec.ir.graph import dma_stages
from tilec.ir.types import ME
from tilec.perf.auto import compile_variant
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

WORLDS = (1, 2, 3, 4)
CALLS = 2
TRIES = 40  # seeds drawn for a combo before it counts as one no generated program takes
ADVERSARY = "0.05"  # seconds a rank's kernels (and every rank's copy engines) start late: waits really wait

# programs that found compiler bugs, run with the default run of their world: (seed, focus, world, schedule, what the
# fixed compiler says or None (it runs and matches torch), what was wrong). test_regressions_still_show_their_bug
# fails if a change to the generator makes a seed draw another program: then pick the seeds again.
REGRESSIONS: list[tuple[int, bool, int, str, str | None, str]] = [
    (4, True, 2, "fused-push", "no barrier between them", "fused-push of a copy whose buffer the next stage reads with "
     "no barrier between them: the verifier rejected the graph (read before flag), now a located ScheduleError"),
    (9, True, 3, "fused-push", "no barrier between them", "the same at world 3"),
]


# the schedules with flags again, with every copy stage that qualifies on the copy engines (transport dma: a
# ScheduleError where none qualifies, like a schedule that does not apply)
VARIANTS = (*SCHEDULES, "flags+dma", "fused-push+dma")


def _compile(g, variant):
    return compile_variant(f"tests/generated/{g.name}.tile", g.world, variant, source=g.text)


def compile_combo(g: GenProgram, c: Combo):
    return tilec.compile(f"tests/generated/{g.name}.tile", c.world, c.schedule, source=g.text, transport=c.transport,
                         granularity=c.granularity, start_local=c.start_local, group_m=c.group_m)


def _all_to_all_pull(prog) -> bool:
    """fused-pull fused a copy whose source index has `rank` into its consumer (the class it once got wrong)."""
    return any("rank" in p for p in re.findall(r"pull\(([^)]*) via ", prog.show()))


def _pushes_on_copy_engines(prog) -> bool:
    """A copy engine stage stores into peers (a push: the senders set the peers' counters)."""
    return any(st.access.rank != ME for s in dma_stages(prog.graph) for st in s.body)


def find_program(c: Combo, first_seed: int, tries: int = TRIES, push: bool = False):
    """(program, compiled) for combo `c`: the first of `tries` generated programs (seeds from first_seed; mostly
    focused ones, a gather or a push of an input first, where a schedule transforms gathers or a transport moves
    copies) that `c`'s options compile, or None. Preferred where one of them has it: at world 2+, an all-to-all
    pull in a fused-pull row, and in a dma row with `push`, a copy-engine stage that pushes. Anything but a
    ScheduleError is a failure."""
    found = None
    cycle = (True, "push", True, False) if c.schedule not in ("bsp", "flags") or c.transport == "dma" else \
        (False, True, False, "push")
    for k in range(tries):
        g = generate(first_seed + k, c.world, focus=cycle[k % 4], dtype=c.dtype)
        try:
            prog = compile_combo(g, c)
        except ScheduleError:
            continue
        except Exception as e:  # a generated program is valid: only a schedule may refuse it
            raise AssertionError(f"{g.name} under {c.label}: compile raised {type(e).__name__}: {e}\n{g.text}") from e
        if c.world == 1 or (c.schedule != "fused-pull" or _all_to_all_pull(prog)) and \
                (c.transport != "dma" or not push or _pushes_on_copy_engines(prog)):
            return g, prog
        found = found or (g, prog)
    return found


@cache
def default_plan() -> tuple[tuple, frozenset]:
    """The default run's rows ((combo, (program, compiled)), ...) and what they leave uncovered (nothing)."""
    rows, left = covering(lambda c, i: find_program(c, 30_000 + 1000 * i, push=i % 2 == 0))
    return tuple(rows), frozenset(left)


def run_cases(world: int, cases) -> tuple[list[str], Counter]:
    """Run every (label, program, compiled) of `cases` at `world` in one spawn, two calls each, under the adversary;
    returns (failures, {(label, outcome): n})."""
    failures: list[str] = []
    stats: Counter = Counter()
    batch, meta = [], {}
    for i, (label, g, prog) in enumerate(cases):
        calls = make_calls(prog, CALLS, seed=g.seed * 10 + i + 100 * world)
        meta[(g.name, label)] = (g, calls)
        batch.append(((g.name, label), prog, calls, g.plain))
    if not batch:
        return failures, stats
    mp = pytest.MonkeyPatch()
    mp.setenv("TILEC_CPU_ADVERSARY", ADVERSARY)  # rank processes inherit it
    try:
        results = spawn(_workers.run_cases, world, heap_bytes=1 << 24, timeout=900, args=(batch,))
    finally:
        mp.undo()
    for (name, label), (g, calls) in meta.items():
        bad = []
        for c, ins in enumerate(calls):
            for r, want in enumerate(g.expect(ins)):
                got = results[r][(name, label)][c]
                for out, (value, mask) in want.items():
                    err = _rel_err(got[out].float()[mask], value[mask])
                    if not err <= g.tol:
                        bad.append(f"rank {r} call {c + 1} {out}: relative error {err:.3g} > {g.tol:g}")
        stats[label, "ran" if not bad else "WRONG"] += 1
        if bad:
            failures.append(f"{name} under {label}: " + "; ".join(bad[:4]) + f"\n{g.text}")
    return failures, stats


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    if torch.isnan(got).any():
        return float("inf")
    if got.numel() == 0:
        return 0.0
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def run_world(world: int, specs) -> tuple[list[str], Counter]:
    """Compile every program of `specs` ((seed, focus) pairs) at `world` under every schedule of VARIANTS (default
    options) and run what compiles; returns (failures, {(schedule, outcome): n})."""
    failures: list[str] = []
    stats: Counter = Counter()
    cases = []
    for seed, focus in specs:
        g = generate(seed, world, focus=focus)
        for s in VARIANTS:
            where = f"{g.name} schedule {s}"
            try:
                cases.append((s, g, _compile(g, s)))
            except ScheduleError as e:
                stats[s, "does not apply"] += 1
                if s == "bsp" or not str(e).strip():
                    failures.append(f"{where}: {e}\n{g.text}")
            except Exception as e:  # a generated program is valid: only a schedule may refuse it
                failures.append(f"{where}: compile raised {type(e).__name__}: {e}\n{g.text}")
                stats[s, "error"] += 1
    more, ran = run_cases(world, cases)
    return failures + more, stats + ran


def _check(failures: list[str], stats: Counter) -> None:
    assert not failures, f"{len(failures)} failure(s) ({dict(stats)}):\n\n" + "\n\n".join(failures)


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"w{w}")
def test_option_combinations_match_torch(world):
    """The covering array's rows of this world, and the regression programs of this world, in one spawn."""
    rows, _left = default_plan()
    cases = [(c.label, g, prog) for c, (g, prog) in rows if c.world == world]
    for seed, focus, w, schedule, says, _what in REGRESSIONS:
        if w == world and says is None:
            g = generate(seed, world, focus=focus)
            cases.append((schedule, g, _compile(g, schedule)))
    assert cases
    _check(*run_cases(world, cases))


def test_the_default_run_covers_every_pair_of_options():
    """Every pair of option values (and the triples gen_programs.TRIPLES names) that a valid combo holds is held by
    a row of the default run, each row with a program its options compile."""
    rows, left = default_plan()
    assert not left, f"no generated program runs under: {sorted(left)[:8]}"
    held = set().union(*(interactions(c) for c, _p in rows))
    for name, values in OPTIONS.items():
        for other, others in OPTIONS.items():
            if name < other:
                for a in values:
                    for b in others:
                        pair = tuple(sorted(((name, a), (other, b)), key=lambda x: list(OPTIONS).index(x[0])))
                        possible = any(getattr(c, name) == a and getattr(c, other) == b for c in valid_combos())
                        assert not possible or pair in held, pair
    assert len(rows) <= 48  # the default run stays a few dozen programs


def test_dma_is_refused_where_a_schedule_leaves_no_copy_stage_on_flags():
    """The combos the covering array leaves out: transport=dma under bsp and fused-pull, on programs they take
    with transport=sm, is a ScheduleError saying why."""
    for schedule in OPTIONS["schedule"]:
        if schedule not in DMA_SCHEDULES:
            sm = Combo(schedule, "sm", "auto", False, 8, 2, "f32")
            g, _prog = find_program(sm, 100)
            with pytest.raises(ScheduleError, match="transport=dma(: no copy stage| needs flags)"):
                compile_combo(g, Combo(**{**sm.__dict__, "transport": "dma"}))


@pytest.mark.slow
@pytest.mark.gen_long
@pytest.mark.parametrize("schedule", OPTIONS["schedule"])
@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"w{w}")
def test_every_option_combination_matches_torch(world, schedule):
    """The full product of the options (gen_programs.valid_combos) of this world and schedule, a program each."""
    first = int(os.environ.get("TILEC_GEN_SEED", "1000"))
    cases, none = [], []
    for i, c in enumerate(x for x in valid_combos() if x.world == world and x.schedule == schedule):
        found = find_program(c, first + 1000 * i)
        if found is None:
            none.append(c.label)
            continue
        cases.append((c.label, *found))
    failures, stats = run_cases(world, cases)
    stats["no program"] = len(none)
    _check(failures, stats)


@pytest.mark.slow
@pytest.mark.gen_long
@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"w{w}")
def test_many_generated_programs_match_torch(world):
    first, n = int(os.environ.get("TILEC_GEN_SEED", "1000")), int(os.environ.get("TILEC_GEN_LONG", "40"))
    _check(*run_world(world, [(s, s % 4 == 0) for s in range(first, first + n)]))  # a quarter focused


# -- the generator itself (no spawn) ---------------------------------------------------------------------------------


def test_generator_is_deterministic_and_varied():
    texts = [generate(seed, 3).text for seed in range(30)]
    assert texts == [generate(seed, 3).text for seed in range(30)]
    assert len(set(texts)) == 30


# what the generated programs must contain between them: every stage kind and every index form
FEATURES = {
    "pull whose source index has `rank`": r"= [^\n]*X\d+@r\[[^\]]*rank",
    "rank loop var in a destination": r"\n    T\d+\[[^\]]*\*?r\b",
    "push into a peer": r"\n    T\d+@r\[",
    "push whose destination has `rank`": r"\n    T\d+@r\[[^\]]*rank",
    "a stage result read on a peer": r"T\d+@[rs]\[",
    "a row picked by a rank variable alone": r"\n    T\d+(@r)?\[(r|rank)(\*\d+)?( \+ \d+)?, ",
    "sum over ranks": r"sum s in ranks: ",
    "GEMM": r"sum k in [^:]+: [^\n]*@ ",
    "scalar loop": r"\b[ij] in [^,:]+ by 1\b",
    "split loop `j*BS + m`": r"j\*BS \+ m",
    "`R/BS` trips": r"in R/BS by 1",
    "`M/W` in an index": r"\*M/W",
    "offset": r"[mn] \+ \d+[,\]]",
    "elementwise math": r"(exp|log|sqrt|relu|sigmoid|tanh|silu|max|min)\(",
    "`rank` as a value": r"\(rank \+ 1\)",
    "a [1, N] row broadcast": r"X\d+\[[01], ",
    "stages without a barrier between them": r"\n  stage [^\n]*\n[^\n]*\n  stage ",
    "f16": r"f16\[", "bf16": r"bf16\[", "f32": r"f32\[",
}


def test_generator_covers_the_language():
    seen: Counter = Counter()
    ragged = exact = 0
    for world in WORLDS:
        for seed in range(40):
            g = generate(seed, world)
            seen.update(f for f, rx in FEATURES.items() if re.search(rx, g.text))
            for st in g.stages:
                for ix in st.dest.index:
                    if ix.frame and ix.frame.kind != "scalar":
                        ragged += ix.frame.length % ix.frame.step != 0
                        exact += ix.frame.length % ix.frame.step == 0
    missing = [f for f in FEATURES if seen[f] < 2]
    assert not missing, f"the generator never made: {missing} ({dict(seen)})"
    assert ragged > 20 and exact > 20


def test_generated_programs_compile_under_every_schedule_or_say_why():
    """Compile only (no run), more programs than the run: a schedule may refuse with a reason, nothing else fails,
    and bsp takes every program (they are all valid)."""
    failures, applied = [], Counter()
    for world in WORLDS:
        for seed in range(100, 125):
            g = generate(seed, world)
            for s in SCHEDULES:
                try:
                    _compile(g, s)
                    applied[s] += 1
                except ScheduleError as e:
                    if s == "bsp" or f"{s}" not in str(e) and "replace-barriers" not in str(e):
                        failures.append(f"seed {seed} world {world} {s}: {e}")
                except Exception as e:
                    failures.append(f"seed {seed} world {world} {s}: {type(e).__name__}: {e}\n{g.text}")
    assert not failures, "\n".join(failures)
    assert all(applied[s] >= 10 for s in SCHEDULES), applied


def _tile(var: str, n: int) -> Frame:
    return Frame("tile", var, None, 1, n, 2, (f"{var} in {n} by 2",), var)


def _model(world, tensors, dest, value, loops):
    g = GenProgram("t", world, 0, "", tensors, [Stage("s", [], loops, dest, value)])
    ins = [{n: torch.randn(t.shape) for n, t in tensors.items() if t.kind == "in"} for _ in range(world)]
    return ins, g.expect(ins)


def test_model_all_to_all_reduce_scatter_and_push():
    """The model against torch written by hand: `Y[r*R + m, n] = X@r[rank*R + m, n]` (and the same as a push,
    `Y@r[rank*R + m, n] = X[r*R + m, n]`) is a block transpose; `sum s in ranks: X@s[rank*R + m, n]` a
    reduce-scatter."""
    W, R, C = 3, 2, 4
    m, n = _tile("m", R), _tile("n", C)
    tensors = {"X": Tensor("X", "in", "f32", (W * R, C), True), "Y": Tensor("Y", "out", "f32", (W * R, C), True)}
    at = lambda v: (Idx(m, ((v, R, "R"),), 0), Idx(n, (), 0))  # noqa: E731
    pull = _model(W, tensors, Load("Y", None, at("r")), Load("X", "r", at("rank")), [("r", W)])
    push = _model(W, tensors, Load("Y", "r", at("rank")), Load("X", None, at("r")), [("r", W)])
    for ins, outs in (pull, push):
        for p, out in enumerate(outs):
            y, mask = out["Y"]
            assert bool(mask.all())
            assert torch.equal(y, torch.cat([ins[q]["X"][p * R:(p + 1) * R] for q in range(W)]))
    tensors["Y"] = Tensor("Y", "out", "f32", (R, C), False)
    ins, outs = _model(W, tensors, Load("Y", None, (Idx(m, (), 0), Idx(n, (), 0))),
                       Node("rsum", (Load("X", "s", at("rank")),), "s"), [])
    for p, out in enumerate(outs):
        assert torch.allclose(out["Y"][0], sum(ins[q]["X"][p * R:(p + 1) * R] for q in range(W)))


def test_model_rejects_what_is_not_well_defined():
    """A read of elements nobody wrote, and two tasks writing one element, are not programs the generator makes."""
    W, R, C = 2, 2, 4
    m, n = _tile("m", R), _tile("n", C)
    plain = (Idx(m, (), 0), Idx(n, (), 0))
    placed = Tensor("P", "buf", "f32", (W * R, C), True)
    tensors = {"X": Tensor("X", "in", "f32", (R, C), True), "P": placed,
               "Y": Tensor("Y", "out", "f32", (W * R, C), False)}
    place = Stage("a", [], [], Load("P", None, (Idx(m, (("rank", R, "R"),), 0), Idx(n, (), 0))), Load("X", None, plain))
    read_all = Stage("b", [], [("r", W)], Load("Y", None, (Idx(m, (("r", R, "R"),), 0), Idx(n, (), 0))),
                     Load("P", "r", (Idx(m, (("rank", R, "R"),), 0), Idx(n, (), 0))))  # block `rank` of every peer
    ins = [{"X": torch.randn(R, C)} for _ in range(W)]
    with pytest.raises(Invalid, match="nobody wrote"):
        GenProgram("t", W, 0, "", tensors, [place, read_all]).expect(ins)
    twice = Stage("c", [], [("r", W)], Load("Y", None, plain), Load("X", "r", plain))  # every r writes Y[m, n]
    with pytest.raises(Invalid, match="twice"):
        GenProgram("t", W, 0, "", tensors, [twice]).expect(ins)


@pytest.mark.parametrize("seed,focus,world,schedule,says,what", REGRESSIONS)
def test_regressions_still_show_their_bug(seed, focus, world, schedule, says, what):
    g = generate(seed, world, focus=focus)
    if says is None:
        _compile(g, schedule)
        return
    with pytest.raises(ScheduleError, match=says):
        _compile(g, schedule)


def test_default_run_has_all_to_all_pulls_at_every_world():
    """The fused-pull miscompile of a copy whose source index has `rank` (wrong on every rank but 0): at worlds 2-4
    the default run's fused-pull rows fuse such a copy into its consumer."""
    rows, _left = default_plan()
    for world in WORLDS[1:]:
        pulls = [prog for c, (_g, prog) in rows if c.world == world and c.schedule == "fused-pull"]
        assert any(_all_to_all_pull(p) for p in pulls), f"no fused-pull row of world {world} pulls an all-to-all"


@pytest.mark.parametrize("world", [2, 4])
def test_fixed_peers_match_torch(world):
    """Generated gathers from a fixed rank (`X@(1)[...]`, gen_programs.FIXED_PEERS: a broadcast) under every schedule,
    against the generator's model."""
    failures, stats = run_world(world, [(s, "fixed") for s in range(3)])
    _check(failures, stats)
    assert sum(n for (_s, outcome), n in stats.items() if outcome != "does not apply") >= 6, dict(stats)


def test_ring_peers_match_torch():
    """Generated gathers whose peer goes round the ring (`X@(rank + r + 1)[...]`, gen_programs.RING_PEERS) under
    every schedule at world 3, against the generator's model (two programs: this file stays quick)."""
    failures, stats = run_world(3, [(s, "ring") for s in range(2)])
    _check(failures, stats)
    assert sum(n for (_s, outcome), n in stats.items() if outcome != "does not apply") >= 4, dict(stats)
