"""Generated programs (tests/gen_programs.py) under every schedule that accepts them, worlds 1-4, against torch.

Each world compiles its programs with every schedule (a ScheduleError with its reason is fine: that schedule does
not apply; any other error fails), then runs every compiled pair in one spawn, two calls with different inputs, and
compares every output element the program writes with the generator's torch model. The default run is short;
`pytest -m gen_long tests/test_generated_programs.py` runs many more programs (TILEC_GEN_LONG per world, seeds from
TILEC_GEN_SEED).
"""

from __future__ import annotations

import os
import re
from collections import Counter

import pytest
import torch

from tests import _workers
from tests._util import SCHEDULES, make_calls
from tests.gen_programs import Frame, GenProgram, Idx, Invalid, Load, Node, Stage, Tensor, generate
from tilec.errors import ScheduleError
from tilec.perf.auto import compile_variant
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

WORLDS = (1, 2, 3, 4)
SHORT = 3  # programs per world in the default run
FOCUSED = 4  # and programs that start with an all-to-all gather (generate(focus=True))
CALLS = 2

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


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    if torch.isnan(got).any():
        return float("inf")
    if got.numel() == 0:
        return 0.0
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def run_world(world: int, specs) -> tuple[list[str], Counter]:
    """Compile, run and check every program of `specs` ((seed, focus) pairs) at `world`; returns (failures,
    {(schedule, outcome): n})."""
    failures: list[str] = []
    stats: Counter = Counter()
    batch, meta = [], {}
    for seed, focus in specs:
        g = generate(seed, world, focus=focus)
        for i, s in enumerate(VARIANTS):
            where = f"{g.name} schedule {s}"
            try:
                prog = _compile(g, s)
            except ScheduleError as e:
                stats[s, "does not apply"] += 1
                if s == "bsp" or not str(e).strip():
                    failures.append(f"{where}: {e}\n{g.text}")
                continue
            except Exception as e:  # a generated program is valid: only a schedule may refuse it
                failures.append(f"{where}: compile raised {type(e).__name__}: {e}\n{g.text}")
                stats[s, "error"] += 1
                continue
            calls = make_calls(prog, CALLS, seed=seed * 10 + i + 100 * world + 50_000 * focus)
            meta[(g.name, s)] = (g, calls)
            batch.append(((g.name, s), prog, calls, g.plain))
    if not batch:
        return failures, stats
    results = spawn(_workers.run_cases, world, heap_bytes=1 << 24, timeout=900, args=(batch,))
    for (name, s), (g, calls) in meta.items():
        bad = []
        for c, ins in enumerate(calls):
            for r, want in enumerate(g.expect(ins)):
                got = results[r][(name, s)][c]
                for out, (value, mask) in want.items():
                    err = _rel_err(got[out].float()[mask], value[mask])
                    if not err <= g.tol:
                        bad.append(f"rank {r} call {c + 1} {out}: relative error {err:.3g} > {g.tol:g}")
        stats[s, "ran" if not bad else "WRONG"] += 1
        if bad:
            failures.append(f"{name} schedule {s}: " + "; ".join(bad[:4]) + f"\n{g.text}")
    return failures, stats


def _check(world: int, specs) -> None:
    failures, stats = run_world(world, specs)
    assert not failures, f"{len(failures)} failure(s) ({dict(stats)}):\n\n" + "\n\n".join(failures)


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"w{w}")
def test_generated_programs_match_torch(world):
    specs = [*((s, False) for s in range(SHORT)), *((s, True) for s in range(FOCUSED)),
             *((s, f) for s, f, w, *_ in REGRESSIONS if w == world)]
    _check(world, list(dict.fromkeys(specs)))


@pytest.mark.slow
@pytest.mark.gen_long
@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"w{w}")
def test_many_generated_programs_match_torch(world):
    first, n = int(os.environ.get("TILEC_GEN_SEED", "1000")), int(os.environ.get("TILEC_GEN_LONG", "40"))
    _check(world, [(s, s % 4 == 0) for s in range(first, first + n)])  # a quarter focused


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
    """The fused-pull miscompile of a copy whose source index has `rank` (wrong on every rank but 0) is what the
    focused programs of the default run are for: at worlds 2-4 some of them fuse such a copy into its consumer."""
    for world in WORLDS[1:]:
        fused = []
        for seed in range(FOCUSED):
            try:
                shown = _compile(generate(seed, world, focus=True), "fused-pull").show()
            except ScheduleError:
                continue
            fused += [p for p in re.findall(r"pull\(([^)]*) via ", shown) if "rank" in p]
        assert fused, f"no focused program of world {world} pulls a copy whose source index has `rank`"
