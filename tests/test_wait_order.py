"""Loads stay after the waits that guard them. Triton's software pipeliner issues an innermost loop's loads for later
iterations early, above those iterations' waits (it does not order loads after atomics), so a task loop whose tasks
wait and then multiply one tile (no inner loop), or a loop of blocks with a wait per block, read tiles before their
producer released them: rewrites.order_waits prints such loops `tl.range(..., num_stages=1)`. Checked on hand-written
kernel IR, on every example's generated source, and in the PTX Triton builds for an H200 (no GPU needed)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tilec
from tests.test_ring_programs import RING_DIRECT
from tilec.codegen import kir as K
from tilec.codegen import rewrites as R
from tilec.codegen.triton_printer import Printer
from tilec.errors import CompileError, ScheduleError
from tilec.passes.schedules import SCHEDULES

ROOT = Path(__file__).resolve().parents[1]
SYNC = re.compile(r"\btd\.(wait|wait_all|wait_peer|wait_all_peer|arrive|arrive_left|rows_unique|barrier)\(")


def _loop(*body, var="task"):
    return K.For(var, K.Name("pid"), K.Const(8), K.Name("NPROG"), tuple(body))


def _call(fn, *args):
    return K.Do(K.Call(fn, tuple(K.Name(a) for a in args)))


def test_loops_that_wait_are_ordered_and_the_others_are_not():
    waiting = K.Fn("gemm_task", (K.Param("t"),), (_call("wait", "F"), _call("store", "C")))
    relay = K.Fn("relay_task", (K.Param("t"),), (_call("gemm_task", "t"),))  # waits through another function
    plain = K.Fn("copy_task", (K.Param("t"),), (_call("store", "C"),))
    inner = K.Fn("combine_task", (K.Param("t"),), (_loop(_call("wait_all", "F"), _call("load", "Y"), var="k"),
                                                   _loop(_call("load", "Y"), var="j")))
    entry = K.Fn("k0", (), (_loop(_call("gemm_task", "task")), _loop(_call("relay_task", "task")),
                            _loop(_call("copy_task", "task")), _loop(_call("combine_task", "task"))))
    got = R.order_waits(K.Kernel(entry, (waiting, relay, plain, inner)))
    assert [s.ordered for s in got.entry.body] == [True, True, False, True]
    assert [s.ordered for s in got.tasks[3].body] == [True, False]  # the block loop that waits, not its neighbour
    text = Printer().body((got.entry.body[0],), "")
    assert text[1] == "for task in tl.range(pid, 8, NPROG, num_stages=1):", text


def _functions(source: str) -> dict[str, list[str]]:
    out, name = {}, None
    for line in source.splitlines():
        if line.startswith("def "):
            name = line[4:line.index("(")]
            out[name] = []
        elif name and (line.startswith(" ") or not line.strip()):
            out[name].append(line)
        else:
            name = None
    return out


def _pipelined_loops_that_wait(source: str) -> list[str]:
    fns = _functions(source)
    waiting = {n for n, body in fns.items() if any(SYNC.search(ln) for ln in body)}
    while True:  # functions that call a waiting function wait too
        more = {n for n, body in fns.items() if n not in waiting
                and any(re.search(rf"\b{w}\(", ln) for w in waiting for ln in body)}
        if not more:
            break
        waiting |= more
    bad = []
    for name, body in fns.items():
        for i, line in enumerate(body):
            if not re.match(r"\s*for \w+ in range\(", line):
                continue
            ind = len(line) - len(line.lstrip())
            inside = []
            for ln in body[i + 1:]:
                if ln.strip() and len(ln) - len(ln.lstrip()) <= ind:
                    break
                inside.append(ln)
            if any(SYNC.search(ln) or any(re.search(rf"\b{w}\(", ln) for w in waiting) for ln in inside):
                bad.append(f"{name}: {line.strip()}")
    return bad


def test_no_generated_loop_that_waits_is_left_to_the_pipeliner():
    seen = 0
    for path in sorted((ROOT / "examples").glob("*.tile")):
        for world in (1, 2):
            for sched in SCHEDULES:
                for transport in ("sm", "dma"):
                    try:
                        prog = tilec.compile(path, world=world, schedule=sched, transport=transport)
                    except (ScheduleError, CompileError):
                        continue
                    seen += 1
                    assert not _pipelined_loops_that_wait(prog.source), (path.name, world, sched, transport)
    assert seen > 40


def test_a_one_tile_gemm_after_its_wait_loads_after_the_acquire_in_ptx():
    """The ring stage's tiles are waited on before the GEMM reads them: in the PTX for sm_90, no asynchronous copy
    of a tile (cp.async) comes before the first acquire. Before loops were ordered, the pipeliner issued the GEMM
    task's loads ahead of its wait and the GPU multiplied a stale buffer (zeros on the first call)."""
    from tilec.codegen.target_check import compile_for_target

    prog = tilec.compile("tests/ring_direct.tile", world=1, source=RING_DIRECT, schedule="specialized",
                         dims={"M": 16, "N": 32, "K": 32, "BM": 16, "BN": 32, "BK": 32})
    try:
        (built,) = compile_for_target(prog, "cuda:90")
    except Exception as e:  # noqa: BLE001 - a Triton without the NVIDIA backend cannot build PTX here
        pytest.skip(f"no PTX build here: {e}")
    lines = built.ptx.splitlines()
    acquire = min(i for i, ln in enumerate(lines) if ".acquire" in ln)
    early = [ln.strip() for ln in lines[:acquire] if "cp.async.c" in ln]
    assert not early, early[:3]
    assert any("cp.async.c" in ln or "ld.global" in ln for ln in lines[acquire:])
