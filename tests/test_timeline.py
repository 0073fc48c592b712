"""Timeline builds: every task records (stage, program, start, waited, end); tilec.perf.timeline splits a call."""

from itertools import pairwise

import pytest

import tilec
from tilec.errors import ArgumentError
from tilec.perf.timeline import KernelSpan, Timeline, _peak, rank_timelines, summarize
from tilec.runtime import spawn

AG = "examples/ag_gemm.tile"


class _Mod:
    KERNELS = [("k0", 3), ("k1", 2)]


def test_summarize_exact_on_synthetic_records():
    # k0: two slots; task 0 waits 2 and works 8, task 1 works 10 from 0, task 2 waits 5 then works 5 from 10
    # k1 starts 30 after k0 ends: the time between kernels
    recs = [[0, 0, 0, 2, 10], [0, 1, 0, 0, 10], [1, 0, 10, 15, 20],
            [2, 0, 50, 50, 60], [2, 1, 50, 51, 60]]
    t = summarize(recs, _Mod, ["a", "b", "c"])
    k0, k1 = t.kernels
    assert (k0.stages, k0.tasks, k0.programs, k0.span_ns, k0.work_ns, k0.wait_ns) == (("a", "b"), 3, 2, 20, 23, 7)
    assert k0.idle_ns == 2 * 20 - 23 - 7
    assert (k1.programs, k1.work_ns, k1.wait_ns, k1.idle_ns) == (2, 19, 1, 0)
    assert k0.per_stage == (("a", 2, 18, 2, 0, 10), ("b", 1, 5, 5, 10, 20))
    assert k1.per_stage == (("c", 2, 19, 1, 50, 60),)
    assert "stage a: 2 tasks over 0.0 us (first start to last end), 0.01 us work + 0.00 us waiting per task" \
        in t.render()
    assert (t.total_ns, t.between_ns) == (60, 30)
    sh = t.shares()
    assert sh["between kernels"] == pytest.approx(0.5)
    assert sum(sh.values()) == pytest.approx(1.0)


def test_unrun_tasks_and_overlap():
    assert summarize([[0, 0, 0, 0, 0]] * 3 + [[0, 0, 5, 5, 9]] * 2, _Mod, ["s"]).kernels[0].name == "k1"
    assert _peak([(0, 10), (10, 20)]) == 1 and _peak([(0, 10), (5, 20), (6, 7)]) == 3


@pytest.mark.slow
def test_every_task_recorded_once_on_two_ranks():
    progs = [tilec.compile(AG, world=2, schedule=s, timeline=True) for s in ("bsp", "fused-push")]
    res = spawn(rank_timelines, 2, backend="cpu", heap_bytes=1 << 24, args=(progs,))
    for rank in res:
        bsp, push = rank["bsp"], rank["fused-push"]
        totals = {k.__name__: n for p in progs for k, n, *_ in p.module.KERNELS}
        assert [k.tasks for k in bsp.kernels] == [totals[k.name] for k in bsp.kernels]
        assert len(bsp.kernels) == 2 and bsp.between_ns > 0  # a host barrier between gather and GEMM
        (k,) = push.kernels
        assert k.tasks == totals[k.name] and k.stages == ("gather", "gemm") and push.between_ns == 0
        assert all(x.start_ns < x.end_ns for x in bsp.kernels + push.kernels)


def test_timeline_needs_a_timeline_build():
    with pytest.raises(ArgumentError, match="not a timeline build"):
        tilec.compile(AG, world=1, schedule="bsp").timeline_records(object())


def test_render_names_each_kernel():
    t = Timeline((KernelSpan("k0_gemm", ("gemm",), 4, 2, 0, 1000, 1500, 300),))
    out = t.render()
    assert "k0_gemm" in out and "work 75%" in out and "flag waits 15%" in out and "idle 10%" in out


def _records(prog, heap):
    return prog.timeline_records(heap).tolist()


@pytest.mark.slow
def test_a_folded_producers_record_ends_before_the_tasks_it_runs():
    """fold-last runs consumer tasks inside a producer task; their records are their own, so the producer's ends
    first (at its stores and releases) and no program's records overlap: no time is counted twice."""
    dims = dict(B=2, HKV=2, G=4, D=32, S=128, BS=32)
    prog = tilec.compile("examples/flash_decode.tile", world=1, schedule="fused-push", dims=dims, timeline=True)
    split = prog.source[prog.source.index("def split_task("):prog.source.index("def local_task(")]
    assert split.index("td.mark(") < split.index("td.arrive")
    (rows,) = spawn(rank_timelines, 1, backend="cpu", heap_bytes=1 << 24,
                    args=([prog],), kwargs={"read": _records})
    recs = [r for r in rows["fused-push"] if r[4]]
    assert len(recs) == sum(prog.module.TIMELINE_KERNEL_SLOTS)  # split's tasks and the folded stages' each once
    for prog_id in {r[1] for r in recs}:
        mine = sorted((r[2], r[4]) for r in recs if r[1] == prog_id)
        assert all(a[1] <= b[0] for a, b in pairwise(mine)), mine  # one program's records do not overlap
