"""Pictures: the tile graph as DOT after every pass, and timeline builds as Chrome / Perfetto traces.

DOT text is parsed with pydot when it is installed, and always with the structural check below; node and edge
counts are recomputed from the networkx graph. Traces are checked against the trace-event format and against the
records' own summary (tilec.perf.timeline.summarize)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

import tilec
from tilec.cli import main
from tilec.errors import ScheduleError, TilecError
from tilec.ir import dot
from tilec.ir.graph import Pull, stages, state_of
from tilec.passes.schedules import SCHEDULES

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.tile"))
PROGRAMS = sorted((ROOT / "tests" / "programs").glob("*.tile"))


def _compile_all(path: Path, world: int, dims=None):
    for s in SCHEDULES:
        try:
            yield tilec.compile(path, world=world, schedule=s, dims=dims)
        except ScheduleError:
            continue


# -- DOT: a structural parser (no dependency), and the counts the graph implies ---------------------------------

_PUNCT = {"->", "{", "}", "[", "]", ";", "=", ","}
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|->|[{}\[\];=,]|[A-Za-z_][A-Za-z0-9_.]*|\S')


def parse_dot(text: str) -> tuple[set[str], list[tuple[str, str, dict]], list[str]]:
    """(node ids, edges with attributes, cluster names) of the DOT subset tilec writes; asserts balanced braces and
    brackets, closed quotes, and that every edge's ends are declared nodes."""
    toks = _TOKEN.findall(text)
    stray = [t for t in toks if not (len(t) > 1 and t[0] == t[-1] == '"') and t not in _PUNCT
             and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", t)]
    assert not stray, f"unquoted or unclosed text: {stray[:5]}"
    depth, nodes, edges, clusters, i = 0, set(), [], [], 0

    def unq(t: str) -> str:
        assert t.startswith('"') and t.endswith('"'), f"unquoted id {t}"
        return re.sub(r'\\(.)', r"\1", t[1:-1])

    def attrs(j: int) -> tuple[dict, int]:
        out = {}
        if j < len(toks) and toks[j] == "[":
            j += 1
            while toks[j] != "]":
                k, eq, v = toks[j], toks[j + 1], toks[j + 2]
                assert eq == "=", f"attribute without a value near {k}"
                out[k] = unq(v)
                j += 3
                if toks[j] == ",":
                    j += 1
            j += 1
        return out, j

    assert toks[0] == "digraph" and toks[2] == "{"
    i, depth = 3, 1
    while i < len(toks):
        t = toks[i]
        if t == "}":
            depth -= 1
            i += 1
            assert depth >= 0, "unbalanced }"
            continue
        if t == "subgraph":
            clusters.append(unq(toks[i + 1]))
            assert toks[i + 2] == "{"
            depth += 1
            i += 3
            continue
        if t in ("graph", "node", "edge"):
            _, i = attrs(i + 1)
            assert toks[i] == ";"
            i += 1
            continue
        a = unq(t)
        if toks[i + 1] == "->":
            b = unq(toks[i + 2])
            at, i = attrs(i + 3)
            edges.append((a, b, at))
        else:
            assert a not in nodes, f"node {a} declared twice"
            nodes.add(a)
            _, i = attrs(i + 1)
        assert toks[i] == ";", f"statement not ended near {a}"
        i += 1
    assert depth == 0, "unbalanced {"
    for a, b, _ in edges:
        assert a in nodes and b in nodes, f"edge {a} -> {b} to an undeclared node"
    assert len(set(clusters)) == len(clusters), "a cluster named twice"
    return nodes, edges, clusters


def expected_groups(st) -> int:
    """The collapsing rule, restated: whole loops (innermost tile loop first, rank loops last) until a stage
    has at most LIMIT tile groups."""
    trips = [(v.is_rank, v.trips) for v in st.loops if v.trips > 1]
    n = 1
    for _, t in trips:
        n *= t
    order = [t for r, t in reversed(trips) if not r] + [t for r, t in reversed(trips) if r]
    for t in order:
        if n <= dot.LIMIT:
            break
        n //= t
    return n


def expected_counts(g) -> tuple[int, int, int, int]:
    """(nodes, edges, flag edges, barrier edges) of the picture of g."""
    kinds = [d["kind"] for _, d in g.nodes(data=True)]
    nodes = sum(k in ("tensor", "flag", "barrier") for k in kinds)
    edges = len(state_of(g).order) - 1
    for st in stages(g):
        k = expected_groups(st)
        nodes += k
        reads = {(r.source.tensor, "pull") if isinstance(r, Pull) else (r.access.tensor, r.access.remote)
                 for r in st.reads()}
        writes = {(s.access.tensor, s.access.remote) for s in st.body}
        edges += k * (len(reads) + len(writes))
    flag_edges = sum(d["kind"] in ("release", "wait") for _, _, d in g.edges(data=True))
    order = state_of(g).order
    barrier_edges = sum("barrier" in (g.nodes[a]["kind"], g.nodes[b]["kind"]) for a, b in itertools.pairwise(order))
    return nodes, edges + flag_edges, flag_edges, barrier_edges


def _check_picture(g, text: str) -> None:
    nodes, edges, clusters = parse_dot(text)
    n_nodes, n_edges, n_flag, n_barrier = expected_counts(g)
    assert (len(nodes), len(edges)) == (n_nodes, n_edges)
    assert sum(e[2].get("label", "").startswith("flag") for e in edges) == n_flag
    assert sum(e[2].get("label") == "barrier" for e in edges) == n_barrier
    # every task of every stage is in exactly one drawn group
    for st in stages(g):
        groups = [n for n in nodes if n.startswith(f"g:{st.name}:")]
        assert len(groups) == expected_groups(st) <= max(dot.LIMIT, 1) or len(groups) == 1
        counts = [int(m.group(1)) if (m := re.search(r"(\d+) tasks over", _label(text, n))) else 1 for n in groups]
        total = 1
        for v in st.loops:
            total *= v.trips
        assert sum(counts) == total, st.name
        assert f"cluster_s:{st.name}" in clusters
    for k in (state_of(g).kernels or ()):
        assert f"cluster_kernel_{k.name}" in clusters
    # peer traffic carries a rank on every group edge that crosses ranks
    remote = sum(expected_groups(st) * len({(s.access.tensor) for s in st.body if s.access.remote}
                                           | {("r", r.access.tensor) for r in st.reads()
                                              if not isinstance(r, Pull) and r.access.remote})
                 for st in stages(g))
    assert sum(e[2].get("label", "").startswith("peer") for e in edges) == remote


def _label(text: str, node: str) -> str:
    m = re.search(re.escape(f'"{node}" [label="') + r'((?:[^"\\]|\\.)*)"', text)
    return m.group(1).replace("\\n", "\n")


def _pydot_counts(text: str) -> tuple[int, int] | None:
    try:
        import pydot
    except ImportError:
        return None
    (graph,) = pydot.graph_from_dot_data(text)

    def walk(gr):
        n = [x for x in gr.get_nodes() if x.get_name() not in ("node", "edge", "graph", "\\n")]
        e = list(gr.get_edges())
        for sub in gr.get_subgraphs():
            sn, se = walk(sub)
            n, e = n + sn, e + se
        return n, e

    nodes, edges = walk(graph)
    return len(nodes), len(edges)


PICTURE_CASES = [(p, w) for p in EXAMPLES for w in (1, 2)] + [(EXAMPLES[0], 8)] + [(p, 2) for p in PROGRAMS]


@pytest.mark.parametrize("path,world", PICTURE_CASES, ids=[f"{p.parent.name}/{p.stem}-w{w}" for p, w in PICTURE_CASES])
def test_dot_after_every_pass_parses_and_counts_match(path, world):
    seen = 0
    for prog in _compile_all(path, world):
        last = list(prog.snapshots)[-1]
        for after, g in prog.snapshots.items():
            text = prog.draw(after)
            _check_picture(g, text)
            # pydot (when installed) also parses the examples at world 2: ~0.3 s a graph, so here only the last
            # pass's picture of each schedule (test_pydot_reads_every_pass_of_every_example reads them all)
            if world == 2 and path in EXAMPLES and after == last:
                _check_pydot(g, text, (prog.schedule, after))
            seen += 1
    assert seen >= 2


def _check_pydot(g, text: str, what) -> None:
    pd = _pydot_counts(text)
    if pd is not None:
        assert pd == expected_counts(g)[:2], what


@pytest.mark.slow  # ~5 s an example
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_pydot_reads_every_pass_of_every_example(path):
    pytest.importorskip("pydot")
    for prog in _compile_all(path, 2):
        for after, g in prog.snapshots.items():
            _check_pydot(g, prog.draw(after), (prog.schedule, after))


def test_large_stages_collapse_and_keep_the_rank_axis():
    prog = tilec.compile(EXAMPLES[0], world=4, schedule="flags", dims={"M": 1024, "N": 1024, "K": 512})
    text = prog.draw()
    nodes, edges, _ = parse_dot(text)
    gather = sorted(n for n in nodes if n.startswith("g:gather:"))
    # 4 ranks x 4 row tiles x 16 k tiles: the k loop, then the rows go; the rank axis stays
    assert gather == [f"g:gather:r={r}" for r in range(4)]
    assert all("64 tasks over m, k" in _label(text, n) for n in gather)
    assert {e[2].get("label") for e in edges if e[1] in gather} == {f"peer: from rank {r}" for r in range(4)}
    assert len([n for n in nodes if n.startswith("g:gemm:")]) <= dot.LIMIT


def test_quoting_survives_quotes_backslashes_and_newlines():
    s = 'a "quoted" \\ back\nslash'
    q = dot._q(s)
    assert q.count('"') - q.count('\\"') == 2 and "\n" not in q
    pydot = pytest.importorskip("pydot")
    (g,) = pydot.graph_from_dot_data(f'digraph x {{ {q} [label={q}]; }}')
    assert len(g.get_nodes()) == 1


def test_draw_arguments_and_files(tmp_path, monkeypatch):
    prog = tilec.compile(EXAMPLES[0], world=2, schedule="bsp")
    with pytest.raises(TilecError, match="no pass named 'fuse-comm'"):
        prog.draw("fuse-comm")
    with pytest.raises(TilecError, match="format 'jpg'"):
        prog.draw(format="jpg")
    with pytest.raises(TilecError, match="does not exist"):
        prog.draw(path=tmp_path / "missing" / "x.dot")
    out = tmp_path / "g.dot"
    assert prog.draw("lower", path=out) == out.read_text()
    assert "barrier" in out.read_text() and "cluster_kernel" not in out.read_text()  # kernels come with persist
    monkeypatch.setattr(dot.shutil, "which", lambda _name: None)  # no graphviz: the DOT text is written beside
    with pytest.raises(dot.RenderUnavailable, match=r"wrote .*g2\.dot; render it with `dot -Tpng"):
        prog.draw(format="png", path=tmp_path / "g2.png")
    assert (tmp_path / "g2.dot").read_text() == prog.draw() and not (tmp_path / "g2.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.dot", "g2.dot"]  # no temporary left behind


@pytest.mark.skipif(dot.renderer() is None, reason="graphviz's dot is not installed")
def test_png_and_svg_render_through_graphviz(tmp_path):
    prog = tilec.compile(EXAMPLES[0], world=2, schedule="fused-push")
    png = prog.draw(format="png", path=tmp_path / "g.png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / "g.png").read_bytes() == png
    svg = prog.draw("replace-barriers", format="svg").decode()
    assert "<svg" in svg and "Ag.gather" in svg


def test_cli_show_formats(tmp_path, capsys):
    ex = str(EXAMPLES[0])
    assert main(["show", ex, "-w", "2", "-s", "flags", "--format", "dot", "--after", "replace-barriers"]) == 0
    text = capsys.readouterr().out
    prog = tilec.compile(ex, world=2, schedule="flags")
    assert text == prog.draw("replace-barriers")
    assert main(["show", ex, "-w", "2", "-s", "flags", "-o", str(tmp_path / "g.txt")]) == 0
    assert (tmp_path / "g.txt").read_text() == f"# {prog.options.line()}\n{prog.show()}"
    for argv, msg in ((["--format", "png"], "needs -o PATH"), (["--format", "dot", "--source"], "--source prints"),
                      (["--format", "dot", "-o", str(tmp_path / "no" / "g.dot")], "does not exist"),
                      (["--format", "dot", "-o", str(tmp_path)], "is a directory")):
        assert main(["show", ex, "-w", "2", *argv]) == 2
        err = capsys.readouterr().err
        assert msg in err and len(err.strip().splitlines()) == 1, err


# -- traces ---------------------------------------------------------------------------------------------------


def validate_trace(tr: dict) -> list[str]:
    """Problems with a trace-event JSON object: required fields, complete events with dur >= 0, slices of a track
    that are disjoint or nested (never partly overlapping), named processes and threads."""
    problems = []
    json.loads(json.dumps(tr))  # plain JSON
    evs = tr["traceEvents"]
    for e in evs:
        for f in ("ph", "ts", "pid", "tid", "name"):
            if f not in e:
                problems.append(f"event without {f}: {e}")
        if e.get("ph") == "X" and not (isinstance(e.get("dur"), int | float) and e["dur"] >= 0):
            problems.append(f"complete event without dur >= 0: {e}")
    named_p = {e["pid"] for e in evs if e["ph"] == "M" and e["name"] == "process_name"}
    named_t = {(e["pid"], e["tid"]) for e in evs if e["ph"] == "M" and e["name"] == "thread_name"}
    tracks: dict = {}
    for e in evs:
        if e["ph"] == "X":
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
    for key, xs in tracks.items():
        if key[0] not in named_p or key not in named_t:
            problems.append(f"track {key} has no process/thread name")
        if [x["ts"] for x in xs] != sorted(x["ts"] for x in xs):
            problems.append(f"track {key}: timestamps not monotonic")
        stack: list[float] = []  # ends of the open slices
        for x in xs:
            while stack and stack[-1] <= x["ts"] + 1e-6:
                stack.pop()
            end = x["ts"] + x["dur"]
            if stack and end > stack[-1] + 1e-6:
                problems.append(f"track {key}: {x['name']} at {x['ts']} overlaps its neighbour without nesting")
            stack.append(end)
    return problems


def test_validator_catches_bad_traces():
    meta = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "ts": 0, "args": {"name": "p"}},
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "ts": 0, "args": {"name": "t"}}]

    def x(ts, dur, tid=1):
        return {"name": "s", "ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur}

    assert validate_trace({"traceEvents": meta + [x(0, 10), x(0, 4), x(10, 5)]}) == []
    assert validate_trace({"traceEvents": meta + [x(0, 10), x(5, 10)]})  # partial overlap
    assert validate_trace({"traceEvents": meta + [x(5, 1), x(0, 1)]})  # not monotonic
    assert validate_trace({"traceEvents": meta + [x(0, -1)]})
    assert validate_trace({"traceEvents": meta + [x(0, 1, tid=2)]})  # unnamed track
    assert validate_trace({"traceEvents": meta + [{"ph": "X", "ts": 0, "dur": 1, "pid": 1, "tid": 1}]})


def test_decode_matches_the_generated_kernels():
    """trace.decode names a record's tile: the same loop values as the kernel's own decode (emit), run in Python. A
    stage that skips its own rank (local-in-place) decodes W - 1 values of that rank loop, r' >= rank being r' + 1."""
    import dataclasses

    from tilec.codegen.build import assemble
    from tilec.codegen.emit import _Emitter, flag_scopes
    from tilec.codegen.triton_printer import Printer
    from tilec.ir.graph import flags
    from tilec.ir.types import trips
    from tilec.perf import trace

    class _TL:
        minimum = staticmethod(min)

    for path in EXAMPLES:
        for prog in _compile_all(path, 2, None):
            g = prog.graph
            for st in stages(g):
                skip = next((a if b == "rank" else b for a, b in st.skip_equal), None)
                loops = [dataclasses.replace(v, extent=prog.world - 1) if v.name == skip else v for v in st.loops]
                for gm in (1, 8):
                    em = _Emitter(g, st, {f.name: i + 1 for i, f in enumerate(flags(g))}, flag_scopes(g), 64)
                    em.bind_tile = lambda *a, **k: None
                    lines = [ln.strip().replace(".to(tl.int32)", "") for ln in Printer().body(
                        assemble(em.decode("t", gm), 4), "")]
                    n = trips(loops)
                    for rank in range(prog.world):
                        seen = set()
                        for t in range(n):
                            ns = {"t": t, "tl": _TL, "rank": rank}
                            for ln in lines:
                                if not ln.startswith("#"):
                                    exec(ln, ns)  # the kernel's integer arithmetic, in Python
                            ours = trace.decode(loops, t, gm, rank)
                            if skip:
                                ours[skip] += ours[skip] >= rank
                            assert ours == {v.name: ns[v.name] for v in st.loops}, (prog.schedule, st.name, gm, t)
                            assert skip is None or ours[skip] != rank
                            seen.add(tuple(sorted(ours.items())))
                        assert len(seen) == n  # every task a different tile


@pytest.fixture(scope="module")
def traced():
    """One timeline call of three schedules of a small AG+GEMM on two CPU ranks: builds, per-rank results."""
    from tilec.perf import trace
    from tilec.runtime import spawn

    dims = {"M": 128, "N": 128, "K": 64}
    progs = [tilec.compile(EXAMPLES[0], world=2, schedule=s, dims=dims, timeline=True)
             for s in ("bsp", "flags", "fused-push")]
    res = spawn(trace.rank_traces, 2, backend="cpu", heap_bytes=1 << 24, args=(progs,), timeout=600)
    return progs, res


def test_trace_of_a_cpu_timeline_build(traced):
    from tilec.perf import trace

    progs, res = traced
    tr = trace.build(progs, [{s: recs for s, (_t, recs) in r.items()} for r in res])
    assert validate_trace(tr) == []
    procs = {e["pid"]: e["args"]["name"] for e in tr["traceEvents"] if e["name"] == "process_name"}
    assert sorted(procs.values()) == sorted(f"rank {r} · {p.schedule}" for p in progs for r in range(2))
    xs = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    for prog in progs:
        total = sum(n for _k, n, *_ in prog.module.KERNELS)
        for rank in range(2):
            mine = [e for e in xs if procs[e["pid"]] == f"rank {rank} · {prog.schedule}"]
            tasks = [e for e in mine if e["cat"] == "task"]
            assert len(tasks) == total  # every task once
            names = {e["name"] for e in tasks}
            assert len(names) == total  # named by stage and a distinct tile
            # against the records' own summary: task time = work + flag waits, waits only where the stage waits
            tl = res[rank][prog.schedule][0]
            work_wait = sum(k.work_ns + k.wait_ns for k in tl.kernels) / 1e3
            assert sum(e["dur"] for e in tasks) == pytest.approx(work_wait, rel=1e-6)
            waits = [e for e in mine if e["cat"] == "flag wait"]
            assert all(e["name"].startswith("wait ") and e["args"]["flags"] for e in waits)
            if prog.schedule == "bsp":
                assert not waits
            else:  # only the GEMM waits, on the gathered rows
                assert waits and all(e["name"] == "wait Ag.gather" for e in waits)
            assert min(e["ts"] for e in mine) >= 0


def test_trace_png(traced, tmp_path):
    from tilec.perf import trace

    progs, res = traced
    tr = trace.build(progs, [{s: recs for s, (_t, recs) in r.items()} for r in res])
    trace.plot(tr, tmp_path / "t.png", "test")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_taxes_trace_arguments(tmp_path, capsys):
    ex = str(EXAMPLES[0])
    assert main(["taxes", ex, "--trace", str(tmp_path / "t.json")]) == 2
    assert "needs --timeline" in capsys.readouterr().err
    assert main(["taxes", ex, "--timeline", "--trace", str(tmp_path / "no" / "t.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_taxes_timeline_trace_cli(tmp_path, capsys):
    """The whole command on one CPU rank at a tiny shape: the trace and its PNG are written and valid."""
    out, png = tmp_path / "t.json", tmp_path / "t.png"
    assert main(["taxes", str(EXAMPLES[0]), "-w", "1", "-D", "M=64", "-D", "N=64", "-D", "K=32", "--timeline",
                 "--trace", str(out), "--trace-png", str(png)]) == 0
    said = capsys.readouterr().out
    assert f"wrote {out}" in said and f"wrote {png}" in said
    tr = json.loads(out.read_text())
    assert validate_trace(tr) == []
    assert set(tr["otherData"]["schedules"]) == set(SCHEDULES)
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "t.png"]
