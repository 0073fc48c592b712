"""What the README and docs/ say holds: the exit-code rule for a missing optional tool, the columns of
`show --schedules`, no internal issue or session numbers in user-facing text, the tour writing outside the
repository, and the description of the committed trace picture (against the trace, and slow: against what today's
code runs)."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from tests._util import ROOT
from tilec.cli import EXIT_CODES, main

README = (ROOT / "README.md").read_text()
TRACE = ROOT / "docs" / "img" / "ag_gemm_w2_trace.json"
AG = "examples/ag_gemm.tile"


@pytest.fixture(autouse=True)
def _at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def test_png_without_graphviz_could_not_be_carried_out(tmp_path, monkeypatch, capsys):
    from tilec.ir import dot

    monkeypatch.setattr(dot.shutil, "which", lambda _name: None)
    out = tmp_path / "g.png"
    rc = main(["show", AG, "--world", "2", "-s", "flags", "--format", "png", "-o", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err  # 1 would say a wrong result was found
    assert f"dot -Tpng {tmp_path / 'g.dot'} -o {out}" in err and (tmp_path / "g.dot").exists() and not out.exists()
    assert "missing optional tool" in EXIT_CODES.split("\n  2")[1]


def test_show_schedules_columns_line_up(capsys):
    assert main(["show", AG, "--schedules", "--world", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, ln in enumerate(lines) if "predicted" in ln)
    rows = [ln for ln in lines[header + 1:] if ln.strip()]
    assert any("+dma" in r for r in rows), rows  # the long names are there to misalign
    ends = {re.match(r"  \S+ +\d+ us", r).end() for r in rows}
    assert ends == {lines[header].index("predicted") + len("predicted")}, lines


def _user_text() -> dict[str, str]:
    import contextlib
    import io

    texts = {"README.md": README}
    texts |= {str(p.relative_to(ROOT)): p.read_text() for p in (ROOT / "docs").glob("*.md")}
    for cmd in ([], ["compile"], ["show"], ["check"], ["run"], ["tune"], ["bench"], ["taxes"], ["calibrate"]):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), pytest.raises(SystemExit):
            main([*cmd, "--help"])
        texts[f"tilec {' '.join(cmd)} --help"] = buf.getvalue()
    return texts


def test_no_internal_issue_or_session_numbers():
    internal = re.compile(r"\b(?:issues?|sessions?|runs?)[ _#-]*\d+|\bsession\d*/", re.I)
    for where, text in _user_text().items():
        found = [m.group() for m in internal.finditer(text)]
        assert not found, f"{where}: {found}"


def test_tour_writes_outside_the_repository():
    """`ruff check .` stays clean after the tour: a compiled module lands in a temporary folder."""
    compiles = [ln for ln in README.splitlines() if ln.startswith("tilec compile")]
    assert compiles
    for line in compiles:
        argv = shlex.split(line.split("#")[0])
        out = argv[argv.index("-o") + 1]
        assert out.startswith("/tmp/"), line


def _tasks(trace: dict, schedule: str) -> dict[int, list[tuple[str, str]]]:
    """Per rank: (track, task name) of every task slice of `schedule`, by start."""
    procs = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    out: dict[int, list] = {}
    for e in sorted((e for e in trace["traceEvents"] if e.get("cat") == "task"), key=lambda e: e["ts"]):
        rank, _, sched = procs[e["pid"]].partition(" · ")
        if sched == schedule:
            out.setdefault(int(rank.split()[1]), []).append((tracks[(e["pid"], e["tid"])], e["name"]))
    return out


def test_trace_picture_is_as_the_readme_says():
    trace = json.loads(TRACE.read_text())
    waits = {(e["pid"], e["tid"]) for e in trace["traceEvents"] if e.get("cat") == "flag wait"}
    assert trace["otherData"]["schedules"] == ["bsp", "flags", "fused-pull", "fused-push", "specialized"]
    for rank in (0, 1):
        bsp = _tasks(trace, "bsp")[rank]
        stages = [name.split()[0] for _, name in bsp]
        assert stages == sorted(stages, key=["gather", "gemm"].index)  # the gather kernel, then the GEMM kernel
        assert not any(n.startswith("gather") for _, n in _tasks(trace, "fused-pull")[rank])
        push = _tasks(trace, "fused-push")[rank]
        assert len({track for track, _ in push}) == 1  # one kernel, one program on the CPU
        kinds = [name.split()[0] for _, name in push]
        first_gemm = kinds.index("gemm")
        assert "gather" in kinds[first_gemm:], kinds  # the copies are spread among the GEMM tiles
    flags_pids = {e["pid"] for e in trace["traceEvents"] if e.get("name") == "process_name"
                  and e["args"]["name"].endswith("· flags")}
    assert any(pid in flags_pids for pid, _ in waits)  # flags' GEMM tiles wait (hatched)


@pytest.mark.slow
def test_trace_picture_is_what_todays_code_runs():
    """The committed fused-push trace runs its tasks in the order today's code runs them on 2 CPU ranks (the
    interpreter runs one program at a time, so the order is the emitted one)."""
    import tilec
    from tilec.perf import trace as trace_mod
    from tilec.run_vs_reference import heap_bytes_for
    from tilec.runtime import spawn

    prog = tilec.compile(AG, world=2, schedule="fused-push", timeline=True)
    per_rank = spawn(trace_mod.rank_traces, 2, backend="cpu", heap_bytes=heap_bytes_for(prog), args=([prog],))
    now = trace_mod.build([prog], [{s: recs for s, (_t, recs) in r.items()} for r in per_rank])
    committed = json.loads(TRACE.read_text())
    for rank in (0, 1):
        want = [name for _, name in _tasks(committed, "fused-push")[rank]]
        got = [name for _, name in _tasks(now, "fused-push")[rank]]
        assert got == want, f"rank {rank}: regenerate docs/img/ag_gemm_w2_trace.* (README, Pictures)"
