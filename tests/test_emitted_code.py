"""Every emitted module reads like hand-written code: no assignment whose value nobody reads, no parameter a function
never reads, no line over 120 characters. Each example and test program under each schedule that applies (world 2;
the examples also at world 4, in a timeline build and with copies on the copy engines), compiled only: the checks
read the source with Python's ast, independently of the kernel IR that produced it."""

from __future__ import annotations

import ast

import pytest

import tilec
from tests._util import PROGRAMS, ROOT
from tilec.errors import CompileError, ScheduleError
from tilec.passes.schedules import SCHEDULES

WIDTH = 120
# an entry kernel's parameters after its buffers are the launch's (tilec.runtime.launch passes them all)
LAUNCH_ARGS = {"ERR", "heap_bases", "rank", "epoch", "timeout_ns", "EPOCH_AT", "NPROG", "INTERPRET", "GRAPH", "PDL",
               "CLAIM"}

EXAMPLES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").glob("*.tile"))
TESTS = sorted(p.relative_to(ROOT).as_posix() for p in PROGRAMS.rglob("*.tile") if "errors" not in p.parts)
CASES = [(p, 2, {}) for p in EXAMPLES + TESTS] + [(p, 4, {}) for p in EXAMPLES] + \
    [(p, 2, {"timeline": True}) for p in EXAMPLES] + [("examples/ag_gemm.tile", 2, {"transport": "dma"})]


def _loads(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _live(stmts: list[ast.stmt], live: set[str], dead: list[int]) -> set[str]:
    """Names live before stmts, given those live after; the lines of assignments nobody reads go to dead."""
    for s in reversed(stmts):
        if isinstance(s, ast.Assign):
            bound = {n.id for t in s.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            if not bound & live:
                dead.append(s.lineno)
            live = (live - bound) | _loads(s.value)
        elif isinstance(s, ast.AugAssign):
            if s.target.id not in live:
                dead.append(s.lineno)
            live = live | _loads(s)
        elif isinstance(s, ast.If):
            live = _live(s.body, live, dead) | _live(s.orelse, live, dead) | _loads(s.test)
        elif isinstance(s, ast.For):
            carried: set[str] = set()
            while True:  # what one trip reads of the trips before it
                more = _live(s.body, live | carried, []) - {s.target.id}
                if more <= carried:
                    break
                carried |= more
            _live(s.body, live | carried, dead)
            live = (live | carried | _loads(s.iter)) - {s.target.id}
        else:
            live = live | _loads(s)
    return live


def problems(source: str) -> list[str]:
    """What a reader of the module would stumble on: long lines, dead assignments, unused parameters."""
    out = [f"line {i} has {len(ln)} characters" for i, ln in enumerate(source.splitlines(), 1) if len(ln) > WIDTH]
    tree = ast.parse(source)
    entries = {e.elts[0].id for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "KERNELS"
               for e in n.value.elts}
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        read = _loads(fn)
        fixed = LAUNCH_ARGS if fn.name in entries else set()
        out += [f"{fn.name}: parameter {a.arg} is never read" for a in fn.args.args
                if a.arg not in read and a.arg not in fixed]
        dead: list[int] = []
        _live(fn.body, set(), dead)
        out += [f"{fn.name}: line {i} assigns a value nobody reads" for i in sorted(dead)]
    return out


def test_the_checks_see_each_kind_of_problem():
    src = "\n".join([
        "def f(a, b, unused):",
        "    x = 0",  # dead: overwritten before any read
        "    x = a + 1",
        "    for i in range(0, 4):",
        "        y = i * 2",  # dead: nobody reads y
        "        x += b",
        "    return x" + " " * 120,
        "KERNELS = []",
    ])
    got = problems(src)
    assert got == ["line 7 has 132 characters", "f: parameter unused is never read",
                   "f: line 2 assigns a value nobody reads", "f: line 5 assigns a value nobody reads"], got
    # a value carried around a loop and read on the next trip is live
    assert problems("def g(a):\n    s = 0\n    for i in range(0, 3):\n        a = a + s\n        s = i\n    return a\n"
                    "KERNELS = []") == []


@pytest.mark.parametrize("path,world,options", CASES, ids=[f"{p}-w{w}{''.join('-' + k for k in o)}"
                                                            for p, w, o in CASES])
def test_emitted_modules_have_no_dead_code_unused_parameters_or_long_lines(path, world, options):
    found, checked = {}, 0
    for w in (world, 1):  # a program whose shapes need another world (15 rows on 2 ranks) is read at world 1
        for schedule in SCHEDULES:
            try:
                prog = tilec.compile(ROOT / path, world=w, schedule=schedule, **options)
            except (ScheduleError, CompileError):
                continue  # the schedule does not apply, or the program is rejected at this world
            checked += 1
            if p := problems(prog.source):
                found[schedule] = p
        if checked:
            break
    assert checked or "redteam" in path, f"{path}: no schedule compiled"
    assert not found, found


@pytest.mark.parametrize("args,limit", [(["examples/ag_gemm.tile", "--world", "2"], 90),
                                        (["examples/flash_decode.tile"], 130)])
def test_the_fused_push_modules_stay_short(args, limit, capsys, monkeypatch):
    """`tilec compile ... --schedule fused-push` of AG+GEMM at world 2 and of flash decode: what a reader reads,
    whole module, at most this many lines (none of them over 120 columns: the test above)."""
    from tilec.cli import main

    monkeypatch.chdir(ROOT)
    assert main(["compile", *args, "--schedule", "fused-push"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# Generated by tilec") and lines[-1] == "]"  # the module, whole
    assert len(lines) <= limit, len(lines)
