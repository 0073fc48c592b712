"""Generated programs with data-dependent rows (tests/gen_rows.py) under every schedule, worlds 1-4, against torch.

Each program is compiled under every schedule and transport (VARIANTS): bsp must take it, any other may refuse with a
ScheduleError naming itself (or a pass of its pipeline) and saying why. What compiles runs on the CPU (one spawn per
world, several programs and calls in it), every output row a stage stored compared with the generator's torch model,
every output row none stored still poisoned (rows past a count, rows a scatter skips). Every second seed (and every
scatter) adds a call with one index or count out of range (or a scatter's repeated row) on every rank, then a good
call with other inputs: the first raises IndexRangeError naming the tensor, the element and its value, the second is
right again.
"""

from __future__ import annotations

import re

import pytest
import torch

from tests.gen_rows import GenRows, generate
from tilec.errors import IndexRangeError, ScheduleError
from tilec.perf.auto import compile_variant
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

VARIANTS = ("bsp", "flags", "specialized", "fused-push", "fused-pull", "flags+dma", "fused-push+dma")
# what a refusal may name: the schedule, or a pass of its pipeline
NAMES = {"bsp": ("bsp",), "flags": ("flags", "replace-barriers"),
         "specialized": ("specialized", "replace-barriers", "fold"),
         "fused-push": ("fused-push", "replace-barriers", "fold"), "fused-pull": ("fused-pull", "replace-barriers"),
         "flags+dma": ("transport=dma", "replace-barriers"),
         "fused-push+dma": ("fused-push", "transport=dma", "replace-barriers", "fold")}
SEEDS = {1: range(0, 5), 2: range(100, 105), 3: range(200, 203), 4: range(300, 302)}
BAD_EVERY = 2  # every second program adds a bad call and a good one after it


def _compile(g: GenRows, variant: str):
    return compile_variant(f"{g.name}.tile", g.world, variant, source=g.text)


def compile_all(g: GenRows) -> tuple[dict, list[str]]:
    progs, failures = {}, []
    for v in VARIANTS:
        try:
            progs[v] = _compile(g, v)
        except ScheduleError as e:
            if v == "bsp" or not any(n in str(e) for n in NAMES[v]):
                failures.append(f"{g.name} under {v}: ScheduleError without its reason: {e}\n{g.text}")
        except Exception as e:  # a generated program is valid: only a schedule may refuse it
            failures.append(f"{g.name} under {v}: compile raised {type(e).__name__}: {e}\n{g.text}")
    return progs, failures


def _rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    if got.numel() == 0:
        return 0.0
    if torch.isnan(got).any():
        return float("inf")
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def check_call(g: GenRows, ins, got_ranks, what: str) -> list[str]:
    bad = []
    for r, want in enumerate(g.expect(ins)):
        for out, (value, stored) in want.items():
            got = got_ranks[r][out].float()
            rows = stored[:, None].expand_as(value) & ~value.isnan()
            err = _rel_err(got[rows], value[rows])
            if not err <= g.tol:
                bad.append(f"{what} rank {r} {out}: relative error {err:.3g} > {g.tol:g}")
            if not bool(got[~stored].isnan().all()):
                rows = sorted({int(i) for i in torch.nonzero(~got[~stored].isnan())[:, 0]})[:6]
                bad.append(f"{what} rank {r} {out}: rows no stage stores were written (of the unstored: {rows})")
    return bad


def run_world(world: int, seeds) -> list[str]:
    failures, cases, plans = [], [], {}
    for n, seed in enumerate(seeds):
        g = generate(seed, world)
        progs, failed = compile_all(g)
        failures += failed
        calls = [g.inputs(seed * 10 + 1)]
        bad = None
        if n % BAD_EVERY == BAD_EVERY - 1 or "scatter" in g.kinds:  # a scatter's: a repeated row
            prefer = "twice" if "scatter" in g.kinds else ("index", "count")[n // BAD_EVERY % 2]
            bad = next((b for k in range(6) if (b := g.bad(seed * 10 + k, prefer)) is not None), None)
        if bad is not None:  # then a good call on the same buffers, with other inputs
            calls = [calls[0], bad[0], g.inputs(seed * 10 + 2)]
        for v, prog in progs.items():
            cases.append(((g.name, v), prog, calls))
            plans[g.name, v] = (g, calls, bad)
    got = spawn("tests._rows_workers:calls_or_errors", world, args=(cases,), heap_bytes=1 << 24, timeout=900)
    for (name, v), (g, calls, bad) in plans.items():
        what = f"{name} under {v}"
        fails = []
        for c, ins in enumerate(calls):
            res = [got[r][name, v][c] for r in range(world)]
            if bad is not None and c == 1:
                for r, (msg, want) in enumerate(zip(res, bad[1], strict=True)):
                    ok = isinstance(msg, str) and (re.fullmatch(want, msg) if bad[2] == "twice" else
                                                   msg.startswith(want) if bad[2] == "count" else msg == want)
                    if not ok:
                        fails.append(f"{what} bad call rank {r}: got {msg if isinstance(msg, str) else 'no error'}"
                                     f", want {want}")
                continue
            if any(isinstance(x, str) for x in res):
                fails.append(f"{what} call {c + 1}: {[x for x in res if isinstance(x, str)][0]}")
                continue
            fails += check_call(g, ins, res, f"{what} call {c + 1}")
        if fails:
            failures.append("; ".join(fails[:4]) + f"\n{g.text}")
    return failures


@pytest.mark.parametrize("world", sorted(SEEDS), ids=lambda w: f"w{w}")
def test_generated_rows_match_torch(world):
    failures = run_world(world, SEEDS[world])
    assert not failures, f"{len(failures)} failure(s):\n\n" + "\n\n".join(failures)


def test_generator_varies_what_it_draws():
    """The seeds run above cover every stage kind, counted loops, peer reads, both dtypes and bad calls of each
    kind (so a change to the generator cannot quietly drop one)."""
    gs = [generate(s, w) for w, seeds in SEEDS.items() for s in seeds]
    kinds = set().union(*(g.kinds for g in gs))
    assert {"gather", "gather-gemm", "combine", "scatter", "copy-pull", "copy-push", "copy-math"} <= kinds, kinds
    texts = "\n".join(g.text for g in gs)
    for construct in ("upto cnt", "@r[idx", "@(rank + 1)[", "sum k in", "[perm", "f16[", "f32["):
        assert construct in texts, construct
    assert generate(5, 2).text == generate(5, 2).text
    assert IndexRangeError  # the error the bad calls raise (rank processes report its text)
