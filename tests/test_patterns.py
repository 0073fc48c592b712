"""GEMM + Reduce-Scatter and GEMM + All-Reduce (examples/gemm_rs.tile, gemm_ar.tile) against torch, every
schedule that applies, 1-4 ranks, ragged shapes; the rank-order sum is bit-identical on every call."""

import re

import pytest
import torch

import tilec
from tilec.errors import ScheduleError
from tilec.ir.graph import state_of
from tilec.passes.schedules import SCHEDULES
from tilec.runtime import spawn

# (256, 128, 64) at world 2: 2x2 output tiles per rank, so the gemm stage runs in grouped order under its rank loop
SHAPES = {1: [(64, 48, 64)], 2: [(128, 64, 96), (70, 40, 50), (256, 128, 64)], 3: [(96, 72, 48)],
          4: [(128, 32, 64)]}


def _inputs(world, m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    a = [torch.randn(m, k // world, generator=g).half() for _ in range(world)]
    b = [torch.randn(k // world, n, generator=g).half() for _ in range(world)]
    return [{"A": a[r], "B": b[r]} for r in range(world)], sum(a[r].float() @ b[r].float() for r in range(world))


@pytest.mark.slow
@pytest.mark.parametrize("world", sorted(SHAPES))
def test_gemm_rs_and_ar_match_torch(world):
    cases, want = [], {}
    for example in ("gemm_rs", "gemm_ar"):
        for m, n, k in SHAPES[world]:
            for sched in SCHEDULES:
                try:
                    prog = tilec.compile(f"examples/{example}.tile", world=world, schedule=sched,
                                         dims={"M": m, "N": n, "K": k})
                except ScheduleError:
                    continue
                calls, refs = [], []
                for seed in (1, 2, 1):  # the third call repeats the first: results must be bit-identical
                    inputs, full = _inputs(world, m, n, k, seed)
                    calls.append(inputs)
                    refs.append(full)
                key = (example, sched, m, n, k)
                cases.append((key, prog, calls, ()))
                want[key] = refs
    got = spawn("tests._workers:run_cases", world, args=(cases,), heap_bytes=1 << 24, timeout=900)
    ran = {key[1] for key in want}
    assert {"bsp", "flags", "fused-push", "specialized"} <= ran
    for rank, res in enumerate(got):
        for key, outs in res.items():
            m = key[2]
            for out, full in zip(outs, want[key], strict=True):
                ref = full[rank * (m // world):(rank + 1) * (m // world)] if key[0] == "gemm_rs" else full
                err = ((out["C"].float() - ref).abs().max() / ref.abs().max()).item()
                assert err < 1e-2, (rank, key, err)
            assert torch.equal(outs[0]["C"], outs[2]["C"]), ("not deterministic", rank, key)


def test_grouped_order_under_rank_loops():
    """gemm_rs's gemm stage loops over (owner rank, m, n): the m/n tiles are still walked in L2-friendly groups,
    the owner outermost."""
    src = tilec.compile("examples/gemm_rs.tile", world=2, schedule="bsp", dims={"M": 256, "N": 128, "K": 64}).source
    assert "t_mn = t % 4" in src and "grouped order: 8 rows of m-tiles" in src and "o = t // 4" in src


def test_fused_push_pushes_to_the_peers_first_and_its_own_rows_last():
    """fused-push's gemm stage goes round the owners starting after this rank, its own rows last (codegen/order.py):
    no rank's reduction waits on a peer's last tiles. Every task still runs once; the results match torch."""
    world, (m, n, k) = 4, (128, 32, 64)
    cases, want = [], {}
    for example in ("gemm_rs", "gemm_ar"):
        prog = tilec.compile(f"examples/{example}.tile", world=world, schedule="fused-push",
                             dims={"M": m, "N": n, "K": k, "BM": 16, "BN": 32})
        call = re.search(r"(?<!def )gemm_task\(([^,]+), A, ", prog.source).group(1)
        per = m // world // 16  # the tasks of one owner: its m-tiles (one n-tile)
        assert f"o = t // {per}" in _task_source(prog.source, "gemm")
        for rank in range(world):
            owners = [eval(call, {"task": t, "rank": rank}) // per for t in range(world * per)]  # noqa: S307
            assert owners == [(rank + 1 + j) % world for j in range(world) for _ in range(per)], (example, rank)
        inputs, full = _inputs(world, m, n, k, 5)
        cases.append((example, prog, [inputs], ()))
        want[example] = full
    got = spawn("tests._workers:run_cases", world, args=(cases,), heap_bytes=1 << 24, timeout=600)
    for rank, res in enumerate(got):
        for example, (out,) in res.items():
            ref = want[example][rank * (m // world):(rank + 1) * (m // world)] if example == "gemm_rs" \
                else want[example]
            err = ((out["C"].float() - ref).abs().max() / ref.abs().max()).item()
            assert err < 1e-2, (rank, example, err)


def _task_source(src: str, stage: str) -> str:
    start = src.index(f"def {stage}_task(")
    return src[start:src.index("@triton.jit", start)]


def test_waits_poll_blocks_and_skip_covered_counters():
    """The merge of flash decode reads all S/BS split partials of its head: one block wait over their counters
    (not one wait per counter), and none for Ls, whose tiles the same counters count (one flag, Os+Ls.split).
    The combine reads the partial of each of the 2 ranks: one block of 2 counters, again none for Lg."""
    # fold=False: with fold-last the merge waits on nothing (the last split runs it)
    src = tilec.compile("examples/flash_decode.tile", world=2, schedule="fused-push", fold=False,
                        dims={"B": 1, "HKV": 2, "G": 4, "D": 64, "S": 512, "BS": 64}).source
    local = _task_source(src, "local")
    assert local.count("td.wait_all(F_Os_Ls_split") == 1 and "tl.arange(0, 8)" in local
    assert "td.wait(" not in local
    combine = _task_source(src, "combine")
    assert combine.count("td.wait") == 1 and "td.wait_all(F_Og_Lg_exchange" in combine
    assert "tl.arange(0, 2)" in combine


def test_specialized_applies_to_every_example():
    """Workgroup specialization: the compute stages and the data-movement stages (tile copies, sums over ranks,
    merges) of one persistent kernel get programs of their own, 25% for data movement."""
    for example in ("ag_gemm", "gemm_rs", "gemm_ar", "flash_decode"):
        prog = tilec.compile(f"examples/{example}.tile", world=2, schedule="specialized")
        (k,) = [k for k in state_of(prog.graph).kernels if k.groups]
        assert k.persistent and len(k.groups) == len(k.stages)
        compute = {"ag_gemm": {"gemm"}, "gemm_rs": {"gemm"}, "gemm_ar": {"gemm"}, "flash_decode": {"split"}}[example]
        moving = [g for s, g in zip(k.stages, k.groups, strict=True) if s not in compute]
        assert sum(moving) == pytest.approx(250, abs=len(moving)), (example, k.stages, k.groups)


def test_a_small_stage_beside_large_ones_keeps_a_share_and_the_model_predicts_it():
    """The MoE's combine (one task) beside a dispatch and GEMMs of thousands: its group's per-mille share rounded to
    0, which the cost model divided by (the scale table at 64 ranks). Every group keeps 1 per mille at least."""
    from tilec.perf.model import H200, predict
    from tilec.perf.taxes import static

    dims = {"T": 64, "H": 1024, "F": 64, "EL": 2, "C": 256, "K": 2, "BT": 64, "BC": 16, "BH": 16, "BF": 64, "BK": 32}
    prog = tilec.compile("examples/moe.tile", world=2, schedule="specialized", dims=dims)
    (k,) = [k for k in state_of(prog.graph).kernels if k.groups]
    share = dict(zip(k.stages, k.groups, strict=True))
    assert share["combine"] >= 1 and all(g >= 1 for g in k.groups), k.groups
    assert predict(static(prog), H200).predicted_us > 0


def test_specialized_says_why_without_a_compute_stage():
    with pytest.raises(ScheduleError, match="no kernel has both a data-movement stage"):
        tilec.compile("tests/programs/elementwise.tile", world=2, schedule="specialized")


@pytest.mark.slow
def test_start_local_order_matches_torch():
    world, (m, n, k) = 3, (96, 64, 64)
    g = torch.Generator().manual_seed(9)
    calls, wants = [], []  # new inputs every call: a stale flag or a skipped tile cannot pass on old values
    for _ in range(2):
        shards = [torch.randn(m // world, k, generator=g).half() for _ in range(world)]
        b = torch.randn(k, n, generator=g).half()
        calls.append([{"A": shards[r], "B": b} for r in range(world)])
        wants.append(torch.cat(shards).float() @ b.float())
    cases = []
    for sched in ("fused-push", "specialized", "flags"):
        prog = tilec.compile("examples/ag_gemm.tile", world=world, schedule=sched, dims={"M": m, "N": n, "K": k},
                             start_local=True)
        assert "rank *" in prog.source
        cases.append((sched, prog, calls, ()))
    got = spawn("tests._workers:run_cases", world, args=(cases,), heap_bytes=1 << 24, timeout=600)
    for rank, res in enumerate(got):
        for sched, outs in res.items():
            assert len(outs) == len(wants)
            for out, want in zip(outs, wants, strict=True):
                err = ((out["C"].float() - want).abs().max() / want.abs().max()).item()
                assert err < 1e-2, (rank, sched, err)
