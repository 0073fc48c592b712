"""Distributed flash decode (examples/flash_decode.tile) against plain softmax attention in torch."""

import math

import pytest

import tilec
from tilec.errors import ArgumentError, ScheduleError
from tilec.ir.graph import state_of
from tilec.runtime import spawn

EXAMPLE = "examples/flash_decode.tile"
TOL = {"f16": 2e-3, "f32": 1e-4}
# (world, dims): GQA ratios 1, 4, 8; batch 1..8; lengths not multiples of BS; empty shards; tiny tiles (the
# broadcast path), tl.dot tiles and streamed ones
CASES = {
    1: [dict(B=3, HKV=2, G=4, D=32, S=96, BS=32), dict(B=2, HKV=2, G=2, D=8, S=32, BS=8)],
    2: [dict(B=2, HKV=2, G=4, D=64, S=64, BS=32), dict(B=8, HKV=1, G=1, D=32, S=32, BS=16),
        dict(B=3, HKV=1, G=8, D=32, S=256, BS=128)],  # BS > 64: attend streams blocks of keys
    3: [dict(B=3, HKV=1, G=8, D=32, S=64, BS=32)],
    4: [dict(B=1, HKV=2, G=1, D=64, S=32, BS=16)],
}


@pytest.mark.slow
@pytest.mark.parametrize("world", sorted(CASES))
def test_flash_decode_schedules_match_torch(world):
    cases = []
    for i, dims in enumerate(CASES[world]):
        for sched in ("bsp", "flags", "fused-push", "specialized"):
            for dtype in ("f16", "f32") if i == 0 else ("f16",):  # f32 on each world's first shape
                retype = {"f16": dtype} if dtype != "f16" else None
                prog = tilec.compile(EXAMPLE, world=world, schedule=sched, dims=dims, retype=retype)
                cases.append((prog, dtype, 10 * i + world))
    results = spawn("tests.fd_workers:run_cases", world, args=(cases,), heap_bytes=1 << 24, timeout=600)
    bad = [(r, row) for r, rows in enumerate(results) for row in rows
           if not all(math.isfinite(e) and e <= TOL[row[1]] for e in row[3])]
    assert not bad, bad
    # every counter bumped exactly its count per call (FLAGS), what epoch * count waits rely on
    assert all(row[4] for rows in results for row in rows), [row[:3] for rows in results for row in rows
                                                             if not row[4]]


def test_fused_pull_says_why_it_does_not_apply():
    with pytest.raises(ScheduleError, match="copies 'Ol', which the program computes"):
        tilec.compile(EXAMPLE, world=2, schedule="fused-pull")


def test_single_persistent_kernel_is_verified():
    prog = tilec.compile(EXAMPLE, world=4, schedule="fused-push")
    kernels = state_of(prog.graph).kernels
    assert len(kernels) == 1 and kernels[0].persistent
    assert kernels[0].stages == ("split", "local", "exchange", "combine")
    assert not any(entry[4] for entry in prog.module.KERNELS)  # only the entry barrier: none between stages
    assert not any(k.barrier_before for k in kernels)


@pytest.mark.slow  # a multi-rank run of many seconds: not in the quick selection
def test_streaming_options_match_torch():
    """noinline task functions, and streamed attend with 32-key blocks (4 per split): same results."""
    dims = dict(B=2, HKV=1, G=8, D=32, S=256, BS=128)
    progs = [tilec.compile(EXAMPLE, world=2, schedule="fused-push", dims=dims, noinline_tasks=True),
             tilec.compile(EXAMPLE, world=2, schedule="fused-push", dims=dims, attend_block=32)]
    assert "range(0, 128, 32)" in progs[1].source
    results = spawn("tests.fd_workers:run_cases", 2, args=([(p, "f16", 3) for p in progs],), heap_bytes=1 << 24,
                    timeout=600)
    assert all(all(math.isfinite(e) and e <= TOL["f16"] for e in row[3]) for rows in results for row in rows)
    with pytest.raises(ArgumentError, match="attend_block=48"):
        tilec.compile(EXAMPLE, attend_block=48)


@pytest.mark.slow  # a multi-rank run of many seconds: not in the quick selection
def test_position_major_cache_matches_torch(tmp_path):
    """The same program over a position-major cache (K, V [B, S, HKV, D], as FlashAttention's KV cache): each
    split then reads rows one KV-head apart instead of one contiguous run; the results must not change."""
    src = open(EXAMPLE).read()
    for head_major, pos_major in (("f16[B, HKV, S, D]", "f16[B, S, HKV, D]"),
                                  ("K[b, g, j*BS + p, :]", "K[b, j*BS + p, g, :]"),
                                  ("V[b, g, j*BS + p, :]", "V[b, j*BS + p, g, :]")):
        assert head_major in src
        src = src.replace(head_major, pos_major)
    path = tmp_path / "flash_decode_bshd.tile"
    path.write_text(src)
    dims = dict(B=3, HKV=2, G=4, D=32, S=96, BS=32)
    progs = [tilec.compile(str(path), world=2, schedule=s, dims=dims) for s in ("bsp", "fused-push")]
    assert progs[0].signature()["K"][2] == (3, 96, 2, 32)
    results = spawn("tests.fd_workers:run_cases", 2, args=([(p, "f16", 5) for p in progs],), heap_bytes=1 << 24,
                    timeout=600)
    assert all(all(math.isfinite(e) and e <= TOL["f16"] for e in row[3]) for rows in results for row in rows)


def test_capture_says_what_it_needs():
    """Program.capture records a CUDA graph: a schedule with a host barrier inside a call cannot be captured, and
    the CPU emulation has no graphs; both are one clear error (the GPU tests replay captured calls)."""
    dims = dict(B=1, HKV=1, G=2, D=32, S=64, BS=32)
    progs = [tilec.compile("examples/flash_decode.tile", world=1, schedule=s, dims=dims) for s in ("bsp", "fused-push")]
    (errs,) = spawn("tests.fd_workers:capture_errors", 1, heap_bytes=1 << 22, timeout=120, args=(progs,))
    assert errs == ["flash_decode: schedule bsp has a host barrier inside a call, which a CUDA graph cannot hold; "
                    "capture a schedule without one (fused-push, specialized, flags)",
                    "flash_decode: capture records a CUDA graph, which needs a GPU; on the CPU emulation call the "
                    "program"]


SPLITS = "examples/flash_decode_splits.tile"
# NS splits of L keys with room NS*L > S (rows past S hold NaN), L below its power-of-two tile (padding rows), split
# counts that are not powers of two, a split count whose last split holds only part of S, GQA 1 and 8
SPLIT_CASES = {
    1: [dict(B=3, HKV=2, G=4, D=32, S=100, NS=3, L=40, BS=64), dict(B=2, HKV=1, G=8, D=32, S=96, NS=5, L=20, BS=32)],
    2: [dict(B=3, HKV=2, G=4, D=32, S=90, NS=3, L=32, BS=32), dict(B=2, HKV=1, G=1, D=32, S=60, NS=7, L=9, BS=16)],
    3: [dict(B=3, HKV=1, G=8, D=32, S=50, NS=2, L=48, BS=64)],
}


@pytest.mark.slow
@pytest.mark.parametrize("world", sorted(SPLIT_CASES))
def test_free_split_count_matches_torch(world):
    """examples/flash_decode_splits.tile: each split's valid keys are min(lens - rank*S, S) - j*L, clamped by
    attend to its L rows; the cache block's rows past S are NaN and must never reach O."""
    cases = [(tilec.compile(SPLITS, world=world, schedule=s, dims=dims), "f16", 10 * i + world)
             for i, dims in enumerate(SPLIT_CASES[world]) for s in ("bsp", "flags", "fused-push", "specialized")]
    assert cases[0][0].signature()["K"][2][2] == SPLIT_CASES[world][0]["NS"] * SPLIT_CASES[world][0]["L"]
    results = spawn("tests.fd_workers:run_cases", world, args=(cases,), heap_bytes=1 << 24, timeout=600)
    bad = [(r, row[:4]) for r, rows in enumerate(results) for row in rows
           if not all(math.isfinite(e) and e <= TOL["f16"] for e in row[3])]
    assert not bad, bad
    assert all(row[4] for rows in results for row in rows)


def test_free_split_count_folds_and_min_stays_an_integer():
    prog = tilec.compile(SPLITS, world=2, schedule="fused-push", dims=SPLIT_CASES[2][0])
    from tilec.ir.graph import folds

    assert ("local", "split") in [(f.consumer, f.producer) for f in folds(prog.graph)]
    split = prog.source[prog.source.index("def split_task("):prog.source.index("def local_task(")]
    # i32 operands, no cast to f32: attend takes the count as is
    assert "tl.minimum(lens_val - rank * 90, 90) - j * 32, " in split
    assert "float32" not in split[split.index("lens_val = "):split.index("tl.store(")]
