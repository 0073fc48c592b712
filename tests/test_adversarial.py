"""Waits that the CPU emulation would otherwise never test.

The Triton interpreter runs a rank's tasks one after another, producers before consumers, so a kernel with no
flag waits at all still computes the right numbers on one rank. Two things close that hole:
- a structural check: every stage that the final graph makes wait on a flag waits on it in the emitted source
  (or on a flag of the same producer, whose counters the same tiles bump together: the emitter drops such a
  covered wait), and waits on nothing else;
- the adversary (TILEC_CPU_ADVERSARY=SECONDS): in call e, rank e % W starts every kernel that much later, so its
  peers reach their waits on its tiles before those tiles exist. Without waits, or with stale ones (a target of
  `count` instead of `epoch * count`), the peers read the last call's data and the result is wrong.
"""

from __future__ import annotations

import re

import pytest
import torch

import tilec
from tests._util import PROGRAMS, ROOT, cat_shards, check_close, make_calls, rel_err
from tilec.errors import ScheduleError
from tilec.ir.graph import flags, stages, state_of, waits
from tilec.passes.schedules import SCHEDULES

EXAMPLES = sorted((ROOT / "examples").glob("*.tile"))
TEST_PROGRAMS = sorted(PROGRAMS.glob("*.tile"))
_WAIT = re.compile(r"td\.wait(?:_all)?\((F_\w+)")


def stage_sources(source: str) -> dict[str, str]:
    """Each stage's emitted lines: from its `# stage NAME (` comment to the next stage comment or definition."""
    out: dict[str, list[str]] = {}
    current = None
    for line in source.splitlines():
        m = re.match(r"\s*# stage (\w+) \(", line)
        if m:
            current = m.group(1)
            out.setdefault(current, [])
        elif line.startswith(("@triton.jit", "def ", "KERNELS")):
            current = None
        elif current is not None:
            out[current].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def missing_waits(prog) -> list[str]:
    """What the emitted source of `prog` fails to wait on (or waits on without cause), per stage."""
    g = prog.graph

    def pname(flag: str) -> str:  # a flag's kernel parameter, as the emitter names it
        return f"F_{re.sub(r'[^0-9A-Za-z_]', '_', flag)}"

    param = {pname(f.name): f for f in flags(g)}
    by_name = {f.name: f for f in flags(g)}
    blocks = stage_sources(prog.source)
    problems = []
    folded = {(fo.consumer, fo.flag): fo for fo in state_of(g).folds}
    for (consumer, flag), fo in folded.items():  # fold-last: the producer's completing arrival runs the consumer
        text = blocks.get(fo.producer, "")
        fp = f"{pname(flag)} + "
        # td.arrive(F + counter, ...), or td.arrive(F, ...) where the flag has one counter
        arrives = by_name[flag].count == 1 or re.search(rf"td\.arrive(_left)?\({pname(flag)}( \+ |,)", text)
        if not arrives or f"{consumer}_task(" not in text:  # a group of one task runs its consumers unconditionally
            problems.append(f"stage {fo.producer}: does not arrive on {flag} and run {consumer}'s tasks")
        if f"td.arrive_left({fp}" in text and f"td.wait({fp}" not in text:  # shared: all but the last must wait
            problems.append(f"stage {fo.producer}: shares {consumer}'s tasks without waiting for the group")
    for st in stages(g):
        need = {w.flag for w in waits(g, st.name) if (st.name, w.flag) not in folded}
        text = blocks.get(st.name)
        if text is None:
            problems.append(f"stage {st.name}: no emitted block")
            continue
        have = {param[p].name for p in _WAIT.findall(text) if p in param}
        # a shared fold: the group's earlier arrivals wait on its own arrival counter (flags.arrive)
        have -= {fo.flag for fo in folded.values() if fo.producer == st.name and
                 f"td.arrive_left({pname(fo.flag)} + " in text}
        for p in _WAIT.findall(text):
            if p not in param:
                problems.append(f"stage {st.name}: waits on {p}, which is no flag of the program")
        for extra in have - need:
            problems.append(f"stage {st.name}: waits on {extra}, which the graph does not make it wait on")
        producers = {by_name[f].producer for f in have}
        for f in sorted(need - have):
            if by_name[f].producer not in producers:  # not even covered by a wait on the same producer's tiles
                problems.append(f"stage {st.name}: the graph waits on {f}; the emitted code does not")
    return problems


def _all_programs():
    for path in [*EXAMPLES, *TEST_PROGRAMS]:
        for world in (2, 4):  # the default dims divide by both
            for s in SCHEDULES:
                try:
                    yield path, world, s, tilec.compile(str(path), world=world, schedule=s)
                except ScheduleError:
                    continue


def test_every_wait_of_the_graph_is_in_the_emitted_source():
    checked = 0
    for path, world, s, prog in _all_programs():
        assert missing_waits(prog) == [], (path.name, world, s)
        checked += bool(flags(prog.graph))
    assert checked >= 30  # programs with flags actually checked


def test_the_structural_check_sees_a_shared_fold_without_its_wait():
    prog = tilec.compile(str(ROOT / "examples" / "flash_decode.tile"), world=2, schedule="fused-push")
    assert missing_waits(prog) == []
    prog.source = re.sub(r"\n *td\.wait\(F_Os_Ls_split_local[^\n]*", "\n            pass", prog.source)
    assert any("shares local's tasks without waiting for the group" in p for p in missing_waits(prog))


def test_the_structural_check_sees_dropped_waits(monkeypatch):
    from tilec.codegen import flags as codegen_flags

    monkeypatch.setattr(codegen_flags.Flags, "wait", lambda self, *a, **k: None)
    prog = tilec.compile(str(ROOT / "examples" / "ag_gemm.tile"), world=2, schedule="fused-push")
    assert "td.wait" not in prog.source
    assert any("the graph waits on Ag.gather" in p for p in missing_waits(prog))


# -- the adversary at run time --------------------------------------------------------------------------------------


def _stale(source: str) -> str:
    """Every wait's target `epoch * count` (or `epoch`, count 1) made `count`: what one call needs, stale after."""
    return re.sub(r"(td\.wait(?:_all)?\([^\n]*?, )epoch(?: \* (\d+))?,", lambda m: f"{m.group(1)}{m.group(2) or 1},",
                  source)


def _variants(example: str, schedule: str) -> dict[str, object]:
    """The right program and two broken ones built from it: no waits, and stale waits."""
    path = str(ROOT / "examples" / f"{example}.tile")
    dims = {"M": 32, "N": 32, "K": 32, "BM": 16, "BN": 32, "BK": 16}
    good = tilec.compile(path, world=2, schedule=schedule, dims=dims)
    assert re.search(r"td\.wait(_all)?\(", good.source)
    out = {"right": good}
    for name, fix in (("no waits", lambda s: re.sub(r"td\.wait(?:_all)?\([^\n]*", "pass", s)),
                      ("stale waits", _stale)):
        bad = tilec.compile(path, world=2, schedule=schedule, dims=dims)
        bad.source = fix(bad.source)
        assert bad.source != good.source
        compile(bad.source, "mutant", "exec")  # still a valid module
        out[name] = bad
    return out


def _ag_gemm(ins, r):
    return cat_shards(ins, "A") @ ins[r]["B"].float()  # B is each rank's own input


def _gemm_rs(ins, r):
    return sum(d["A"].float() @ d["B"].float() for d in ins)[r * 16:(r + 1) * 16]  # this rank's rows


# programs whose waits are on tiles a peer writes (a wait on this rank's own earlier tasks is always satisfied in
# the interpreter, late rank or not: only the structural check above covers those)
@pytest.mark.slow
@pytest.mark.parametrize("example,schedule,expect", [("ag_gemm", "fused-push", _ag_gemm),
                                                     ("gemm_rs", "fused-push", _gemm_rs)], ids=["ag_gemm", "gemm_rs"])
def test_the_adversary_catches_missing_and_stale_waits(example, schedule, expect, monkeypatch):
    from tests import _workers
    from tilec.runtime import spawn

    monkeypatch.setenv("TILEC_CPU_ADVERSARY", "1.0")
    progs = _variants(example, schedule)
    calls = {k: make_calls(p, 3, seed=41) for k, p in progs.items()}
    cases = [(k, p, calls[k], ()) for k, p in progs.items()]
    results = spawn(_workers.run_cases, 2, heap_bytes=1 << 22, timeout=600, args=(cases,))
    worst = {}
    for k in progs:
        errs = []
        for i, ins in enumerate(calls[k]):
            for r in range(2):
                want = expect(ins, r)
                got = results[r][k][i]["C"]
                if k == "right":
                    check_close(got, want, "f16", f"{schedule} call {i + 1} rank {r}")
                errs.append(rel_err(got, want))
        worst[k] = max(errs)
    # the late rank's peer read its rows before they were written: far off, in some call on some rank
    assert worst["no waits"] > 0.1 and worst["stale waits"] > 0.1, worst
    assert torch.isfinite(torch.tensor(worst["right"])) and worst["right"] < 2e-2
