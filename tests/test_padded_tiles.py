"""Row reductions over padded tiles (generated): attend over a key tile shorter than its power-of-two block
(`p in L by BS`, L < BS), lse_merge over a partial count that is not a power of two, with valid counts above,
inside and below the tile. Masked loads give 0 in the padding rows; those are not keys or partials, so the
result must be softmax attention over the real rows only (before the fix attend took them as keys of score 0).

Each draw is a program of splits of L keys, every split's (o, lse) an output, then their merge; torch computes
the same in f32 from the inputs alone. Rows past each sequence's valid length hold NaN: none may reach a result.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

import tilec
from tests import _workers
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

PROGRAM = """
program padded(world W)
  dims  B = {B}, H = {H}, D = {D}, NS = {NS}, L = {L}
  tiles BS = {BS}

  in  Q    : f32[B, H, D]
  in  K    : f32[B, H, NS*L, D]
  in  V    : f32[B, H, NS*L, D]
  in  lens : i32[B]
  out Os   : f32[NS, B, H, D]
  out Ls   : f32[NS, B, H]
  out O    : f32[B, H, D]

  stage split over b in B by 1, h in H by 1, j in NS by 1, p in L by BS:
    Os[j, b, h, :], Ls[j, b, h] = attend(Q[b, h, :], K[b, h, j*L + p, :], V[b, h, j*L + p, :], lens[b] - j*L + {X})
  barrier
  stage merge over b in B by 1, h in H by 1:
    O[b, h, :], _ = lse_merge(Os[:, b, h, :], Ls[:, b, h])
"""


def draw(seed: int) -> dict:
    """A shape whose key tile is padded (L < BS, L not a power of two) or whose split count is not a power of
    two, or both; tiles below 16 rows take attend's broadcast path, 32 and up its streamed loop (attend_block 16),
    16 its tl.dot path."""
    rnd = random.Random(seed)
    while True:
        bs = rnd.choice([8, 16, 32, 64])
        lo = bs // 2 + 1 if bs > 1 else 1
        length = rnd.choice([bs, rnd.randrange(lo, bs + 1)])
        if bs > 16:  # a streamed split stops at its extent rounded up to the block: keep L a multiple of 16 or not
            length = rnd.choice([length, -(-length // 16) * 16])
        ns = rnd.choice([1, 3, 5, 6, 7])
        if length < bs or ns & (ns - 1):
            break
    return dict(B=rnd.randint(1, 3), H=rnd.randint(1, 2), D=rnd.choice([16, 32]), NS=ns, L=length, BS=bs,
                X=rnd.choice([0, 0, length, 3 * length]))  # X > 0: valid counts run past a split's rows


def reference(q, k, v, lens, d):
    """(Os, Ls, O) in f32: each split's softmax attention over its rows below lens[b] + X, then their merge."""
    b_n, h_n, dd = q.shape
    ns, length, x = d["NS"], d["L"], d["X"]
    os_ = torch.zeros(ns, b_n, h_n, dd)
    ls = torch.full((ns, b_n, h_n), float("-inf"))
    o = torch.zeros(b_n, h_n, dd)
    for b in range(b_n):
        for h in range(h_n):
            for j in range(ns):
                n = max(0, min(length, int(lens[b]) - j * length + x))
                if n:
                    rows = slice(j * length, j * length + n)
                    s = k[b, h, rows].double() @ q[b, h].double() / math.sqrt(dd)
                    ls[j, b, h] = torch.logsumexp(s, 0).float()
                    os_[j, b, h] = (torch.softmax(s, 0) @ v[b, h, rows].double()).float()
            w = torch.softmax(ls[:, b, h].double(), 0) if torch.isfinite(ls[:, b, h]).any() else None
            if w is not None:
                o[b, h] = (w[:, None] * os_[:, b, h].double()).sum(0).float()
    return os_, ls, o


def inputs(d: dict, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    total = d["NS"] * d["L"]
    q = torch.randn(d["B"], d["H"], d["D"], generator=g)
    k = torch.randn(d["B"], d["H"], total, d["D"], generator=g)
    v = torch.randn(d["B"], d["H"], total, d["D"], generator=g)
    lens = torch.randint(0, total + 1, (d["B"],), generator=g, dtype=torch.int32)
    lens[0] = total - d["L"] // 2  # the last split part full
    for b in range(d["B"]):  # rows no split may read
        k[b, :, max(0, int(lens[b]) + d["X"]):] = float("nan")
        v[b, :, max(0, int(lens[b]) + d["X"]):] = float("nan")
    return {"Q": q, "K": k, "V": v, "lens": lens}


SEEDS = range(8)


SCHEDULES = ("bsp", "flags")


@pytest.fixture(scope="module")
def padded_runs():
    """Every seed under both schedules, two calls each, in one world-1 spawn (one rank start for the module)."""
    cases, wants, shapes = [], {}, {}
    for schedule in SCHEDULES:
        for seed in SEEDS:
            d = draw(seed)
            src = PROGRAM.format(**d)
            dims = {k: d[k] for k in ("B", "H", "D", "NS", "L", "BS")}
            prog = tilec.compile(f"padded_{seed}.tile", world=1, schedule=schedule, source=src, dims=dims,
                                 attend_block=16)
            calls = [[inputs(d, 100 * seed + c)] for c in range(2)]
            cases.append(((schedule, seed), prog, calls, ()))
            wants[schedule, seed] = [reference(c[0]["Q"], c[0]["K"], c[0]["V"], c[0]["lens"], d) for c in calls]
            shapes[seed] = d
    got = spawn(_workers.run_cases, 1, heap_bytes=1 << 22, timeout=600, args=(cases,))[0]
    return got, wants, shapes


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_padded_rows_are_not_keys_or_partials(padded_runs, schedule):
    got, wants, shapes = padded_runs
    bad = []
    for (sched, seed), per_call in got.items():
        if sched != schedule:
            continue
        for c, out in enumerate(per_call):
            os_, ls, o = wants[schedule, seed][c]
            for name, want in (("Os", os_), ("Ls", ls), ("O", o)):
                have = out[name].float()
                same_inf = torch.isinf(want) == torch.isinf(have)
                fin = torch.isfinite(want)
                err = float((have[fin] - want[fin]).abs().max()) if fin.any() else 0.0
                if not bool(same_inf.all()) or torch.isnan(have).any() or err > 1e-4:
                    bad.append((seed, shapes[seed], c, name, err))
    assert len([k for k in got if k[0] == schedule]) == len(SEEDS)
    assert not bad, bad


def test_draws_cover_padded_tiles_and_odd_split_counts():
    ds = [draw(s) for s in SEEDS]
    assert any(d["L"] < d["BS"] and d["BS"] > 16 for d in ds)  # a padded streamed key tile
    assert any(d["L"] < d["BS"] <= 16 for d in ds)  # a padded whole tile
    assert any(d["NS"] & (d["NS"] - 1) for d in ds)  # partials padded to a power of two
    assert any(d["X"] > 0 and d["L"] < d["BS"] for d in ds)  # counts past the rows of a padded tile
