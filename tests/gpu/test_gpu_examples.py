"""GPU: flash decode, GEMM + RS and GEMM + AR, every applicable schedule, bf16 and fp16, 1, 2 and 4 ranks on the
visible GPU(s)."""

import math

import pytest
import torch

import tilec
from tilec.errors import ScheduleError
from tilec.passes.schedules import SCHEDULES
from tilec.runtime import spawn

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")]


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_flash_decode_on_gpu(world, dtype):
    cases = []
    # one split per tile (tl.dot) and splits longer than a block (attend streams blocks of 64 keys)
    for i, dims in enumerate([dict(B=3, HKV=2, G=4, D=64, S=128, BS=32), dict(B=2, HKV=2, G=8, D=128, S=256, BS=128)]):
        for sched in SCHEDULES:
            try:
                prog = tilec.compile("examples/flash_decode.tile", world=world, schedule=sched, dims=dims,
                                     retype={"f16": dtype})
            except ScheduleError:
                continue
            cases.append((prog, dtype, 5 + i))
    res = spawn("tests.fd_workers:run_cases", world, backend="iris", args=(cases,), heap_bytes=1 << 26, timeout=600)
    tol = 3e-2 if dtype == "bf16" else 5e-3
    bad = [(r, row) for r, rows in enumerate(res) for row in rows if not all(math.isfinite(e) and e <= tol
                                                                              for e in row[3])]
    assert not bad, bad


@pytest.mark.parametrize("world", [1, 2, 4])
def test_flash_decode_free_splits_on_gpu(world):
    """examples/flash_decode_splits.tile: split counts that are not powers of two, keys per split below their tile
    (padding rows), the cache block's rows past S NaN; the streamed attend (L > 64) and the tl.dot one; the shared
    fold where the grid holds every task."""
    cases = []
    for i, dims in enumerate([dict(B=3, HKV=2, G=4, D=64, S=100, NS=3, L=40, BS=64),
                              dict(B=1, HKV=3, G=8, D=128, S=1000, NS=11, L=128, BS=128),
                              dict(B=2, HKV=2, G=8, D=128, S=2000, NS=7, L=320, BS=512)]):
        for sched in ("bsp", "fused-push", "specialized"):
            prog = tilec.compile("examples/flash_decode_splits.tile", world=world, schedule=sched, dims=dims,
                                 retype={"f16": "bf16"})
            cases.append((prog, "bf16", 7 + i))
    res = spawn("tests.fd_workers:run_cases", world, backend="iris", args=(cases,), heap_bytes=1 << 26, timeout=600)
    bad = [(r, row[:4]) for r, rows in enumerate(res) for row in rows if not all(math.isfinite(e) and e <= 3e-2
                                                                                  for e in row[3])]
    assert not bad, bad
    assert all(row[4] for rows in res for row in rows)


@pytest.mark.parametrize("world", [1, 2])
def test_flash_decode_captured_as_cuda_graph(world):
    """The persistent flash decode (and the specialized one) recorded as CUDA graphs: every replay on new inputs,
    and an ordinary call between replays, matches the reference, and afterwards the device epoch and every flag
    counter are where the number of calls puts them (a stale epoch would let a wait pass before its producer)."""
    dims = dict(B=3, HKV=2, G=4, D=64, S=128, BS=32)
    cases = [(tilec.compile("examples/flash_decode.tile", world=world, schedule=s, dims=dims,
                            retype={"f16": "bf16"}), "bf16", 11) for s in ("fused-push", "specialized")]
    res = spawn("tests.fd_workers:captured_cases", world, backend="iris", args=(cases,), heap_bytes=1 << 26,
                timeout=600)
    bad = [(r, row) for r, rows in enumerate(res) for row in rows if not all(math.isfinite(e) and e <= 3e-2
                                                                              for e in row[3])]
    assert not bad and all(len(row[3]) == 7 and row[4] for rows in res for row in rows), (bad, res)


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("example", ["gemm_rs", "gemm_ar"])
def test_gemm_reductions_on_gpu(example, world):
    m, n, k = 256, 192, 128
    g = torch.Generator().manual_seed(3)
    a = [torch.randn(m, k // world, generator=g) for _ in range(world)]
    b = [torch.randn(k // world, n, generator=g) for _ in range(world)]
    cases, wants = [], {}
    for dtype, tdt in (("bf16", torch.bfloat16), ("f16", torch.float16)):  # one rank launch for both dtypes
        wants[dtype] = sum(a[r].to(tdt).float() @ b[r].to(tdt).float() for r in range(world))
        for sched in SCHEDULES:
            try:
                prog = tilec.compile(f"examples/{example}.tile", world=world, schedule=sched,
                                     dims={"M": m, "N": n, "K": k}, retype={"f16": dtype})
            except ScheduleError:
                continue
            calls = [[{"A": a[r].to(tdt), "B": b[r].to(tdt)} for r in range(world)]] * 2
            cases.append((f"{sched}/{dtype}", prog, calls, ()))
    res = spawn("tests._workers:run_cases", world, backend="iris", args=(cases,), heap_bytes=1 << 26, timeout=600)
    for rank, outs in enumerate(res):
        for name, calls in outs.items():
            full = wants[name.split("/")[1]]
            want = full[rank * (m // world):(rank + 1) * (m // world)] if example == "gemm_rs" else full
            for out in calls:
                err = ((out["C"].float().cpu() - want).abs().max() / want.abs().max()).item()
                assert err < 3e-2, (rank, name, err)
