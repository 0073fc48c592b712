"""Generated programs (tests/gen_programs.py) under every schedule that accepts them, worlds 1-4, against torch.

Each world compiles its programs with every schedule (a ScheduleError with its reason is fine: that schedule does
not apply; any other error fails), then runs every compiled pair in one spawn, two calls with different inputs, and
compares every output element the program writes with the generator's torch model. The default run is short;
`pytest -m gen_long tests/test_generated_programs.py` runs many more programs (TILEC_GEN_LONG per world, seeds from
TILEC_GEN_SEED).
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch

import tilec
from tests import _workers
from tests._util import SCHEDULES, make_calls
from tests.gen_programs import generate
from tilec.errors import ScheduleError
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

WORLDS = (1, 2, 3, 4)
SHORT = 3  # programs per world in the default run
CALLS = 2

# (seed, world): programs that found compiler bugs; they run with the default run of their world
REGRESSIONS: list[tuple[int, int, str]] = []


def _compile(g, schedule):
    return tilec.compile(f"tests/generated/{g.name}.tile", world=g.world, schedule=schedule, source=g.text)


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    if torch.isnan(got).any():
        return float("inf")
    if got.numel() == 0:
        return 0.0
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def run_world(world: int, seeds) -> tuple[list[str], Counter]:
    """Compile, run and check every program of `seeds` at `world`; returns (failures, {(schedule, outcome): n})."""
    failures: list[str] = []
    stats: Counter = Counter()
    batch, meta = [], {}
    for seed in seeds:
        g = generate(seed, world)
        for i, s in enumerate(SCHEDULES):
            where = f"seed {seed} world {world} schedule {s}"
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
            calls = make_calls(prog, CALLS, seed=seed * 10 + i + 100 * world)
            meta[(seed, s)] = (g, calls)
            batch.append(((seed, s), prog, calls, g.plain))
    if not batch:
        return failures, stats
    results = spawn(_workers.run_cases, world, heap_bytes=1 << 24, timeout=900, args=(batch,))
    for (seed, s), (g, calls) in meta.items():
        bad = []
        for c, ins in enumerate(calls):
            for r, want in enumerate(g.expect(ins)):
                got = results[r][(seed, s)][c]
                for name, (w, mask) in want.items():
                    err = _rel_err(got[name].float()[mask], w[mask])
                    if not err <= g.tol:
                        bad.append(f"rank {r} call {c + 1} {name}: relative error {err:.3g} > {g.tol:g}")
        stats[s, "ran" if not bad else "WRONG"] += 1
        if bad:
            failures.append(f"seed {seed} world {world} schedule {s}: " + "; ".join(bad[:4]) + f"\n{g.text}")
    return failures, stats


def _check(world: int, seeds) -> None:
    failures, stats = run_world(world, seeds)
    assert not failures, f"{len(failures)} failure(s) ({dict(stats)}):\n\n" + "\n\n".join(failures)


@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"w{w}")
def test_generated_programs_match_torch(world):
    seeds = [*range(SHORT), *(s for s, w, _ in REGRESSIONS if w == world)]
    _check(world, seeds)


@pytest.mark.gen_long
@pytest.mark.parametrize("world", WORLDS, ids=lambda w: f"w{w}")
def test_many_generated_programs_match_torch(world):
    first = int(os.environ.get("TILEC_GEN_SEED", "1000"))
    _check(world, range(first, first + int(os.environ.get("TILEC_GEN_LONG", "40"))))
