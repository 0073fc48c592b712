"""The printer after every pass of every schedule and the emitted Triton source of examples/ag_gemm.tile (world 2),
against goldens; byte stability; and the emitted module on its own (imported from a saved file in a fresh
interpreter, where its launch() runs against a recording context instead of kernels)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

import tilec
from tests._util import ROOT, SCHEDULES, compile_example
from tilec.cli import main as cli_main
from tilec.errors import TilecError
from tilec.ir.graph import barriers, flags, stages, state_of, tensors
from tilec.passes.schedules import pipeline

PASSES = {
    "bsp": ["lower", "persist"],
    "flags": ["lower", "replace-barriers", "local-in-place", "persist"],
    "fused-pull": ["lower", "fuse-comm", "replace-barriers", "persist"],
    "fused-push": ["lower", "fuse-comm", "replace-barriers", "local-in-place", "coarsen-copies", "persist",
                   "fold-last"],
}
for _s in SCHEDULES:  # schedules added later: their pipeline as declared
    PASSES.setdefault(_s, ["lower", *(p.name for p in pipeline(_s))])
SHOW_CASES = [(s, p) for s in SCHEDULES for p in PASSES[s]]


@pytest.fixture(scope="module")
def progs():
    return {s: compile_example(2, s) for s in SCHEDULES}


def test_snapshots_name_the_passes_of_each_schedule(progs):
    for s, prog in progs.items():
        assert list(prog.snapshots) == PASSES[s]
        assert prog.snapshots[PASSES[s][-1]] is prog.graph


@pytest.mark.parametrize("schedule,after", SHOW_CASES, ids=[f"{s}-{p}" for s, p in SHOW_CASES])
def test_show_after_pass_golden(progs, golden, schedule, after):
    golden(f"ag_gemm_w2/{schedule}.{after}.txt", progs[schedule].show(after))


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_source_golden(progs, golden, schedule):
    golden(f"ag_gemm_w2/{schedule}.source.py", progs[schedule].source)


def test_show_default_is_the_final_graph(progs):
    for s, prog in progs.items():
        assert prog.show() == prog.show(PASSES[s][-1])


def test_show_unknown_pass_names_the_passes(progs):
    with pytest.raises(TilecError, match=r"no pass named 'fuse-comm' ran in schedule bsp; passes: lower, persist"):
        progs["bsp"].show("fuse-comm")


def test_byte_stable_within_a_process(progs):
    for s, prog in progs.items():
        again = compile_example(2, s)
        assert again.source == prog.source
        for p in PASSES[s]:
            assert again.show(p) == prog.show(p)


def test_byte_stable_across_hash_seeds(progs):
    """Set and dict iteration order must not leak into the output: another interpreter, another hash seed."""
    code = textwrap.dedent("""
        import json
        from tests._util import SCHEDULES, compile_example
        out = {}
        for s in SCHEDULES:
            p = compile_example(2, s)
            out[s] = [p.source] + [p.show(a) for a in p.snapshots]
        print(json.dumps(out))
    """)
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
                       check=True)
    other = json.loads(p.stdout)
    for s, prog in progs.items():
        assert other[s] == [prog.source] + [prog.show(a) for a in prog.snapshots], s


def test_passes_do_not_mutate_earlier_snapshots(progs):
    lower = progs["fused-pull"].snapshots["lower"]
    assert [st.name for st in stages(lower)] == ["gather", "gemm"] and len(barriers(lower)) == 1
    assert "Ag" in {t.name for t in tensors(lower)}
    assert state_of(progs["fused-pull"].snapshots["lower"]).passes == ("lower",)


def test_graph_shape_per_schedule(progs):
    g = {s: p.graph for s, p in progs.items()}
    # bsp: the barrier stays, no flags, two kernels with a barrier before the second
    assert len(barriers(g["bsp"])) == 1 and flags(g["bsp"]) == []
    assert [(k.stages, k.persistent, k.concurrent, k.barrier_before) for k in state_of(g["bsp"]).kernels] == [
        (("gather",), False, False, False), (("gemm",), False, False, True)]
    # flags: the barrier became a flag; two persistent kernels launched concurrently
    assert barriers(g["flags"]) == [] and [f.name for f in flags(g["flags"])] == ["Ag.gather"]
    assert [(k.stages, k.persistent, k.concurrent, k.barrier_before) for k in state_of(g["flags"]).kernels] == [
        (("gather",), True, True, False), (("gemm",), True, True, False)]
    # fused-pull: the copy stage and its buffer are gone; one kernel
    assert [st.name for st in stages(g["fused-pull"])] == ["gemm"] and flags(g["fused-pull"]) == []
    assert "Ag" not in {t.name for t in tensors(g["fused-pull"])}
    assert [k.stages for k in state_of(g["fused-pull"]).kernels] == [("gemm",)]
    # fused-push: owners push, the flags live on the destination rank; one persistent kernel for both stages
    (f,) = flags(g["fused-push"])
    assert f.write.rank == "r" and f.producer == "gather"  # the counters live on the destination rank
    assert [(k.stages, k.persistent) for k in state_of(g["fused-push"]).kernels] == [(("gather", "gemm"), True)]


def test_cli_show_and_compile_match_the_api(progs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert cli_main(["show", "examples/ag_gemm.tile", "-w", "2", "-s", "flags", "--after", "replace-barriers"]) == 0
    assert capsys.readouterr().out == f"# {progs['flags'].options.line()}\n" + progs["flags"].show("replace-barriers")
    out = tmp_path / "k.py"
    assert cli_main(["compile", "examples/ag_gemm.tile", "-w", "2", "-s", "fused-pull", "-o", str(out)]) == 0
    assert out.read_text() == progs["fused-pull"].source
    assert "1 kernel(s)" in capsys.readouterr().err
    assert cli_main(["show", "examples/ag_gemm.tile", "-w", "2", "-s", "bsp", "--source"]) == 0
    assert capsys.readouterr().out == progs["bsp"].source


def test_cli_check_lists_every_schedule(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert cli_main(["check", "examples/ag_gemm.tile", "-w", "4"]) == 0
    out = capsys.readouterr().out
    for s in SCHEDULES:
        assert f"  {s:<11} verified:" in out
    assert f"{len(SCHEDULES)} of {len(SCHEDULES)} schedules verified for world 4" in out


# -- the emitted module on its own --------------------------------------------------------------------------------

_PROBE = textwrap.dedent("""
    import contextlib, importlib.util, json, sys

    from tilec.runtime import launch

    class Ctx:
        rank, interpret, timeout_ns, graph, pdl = 0, True, 1, False, False
        def __init__(self):
            self.events = []
            self.plan = None  # LaunchContext.plan: the launches of a call, built by the first launch()
        def barrier(self):
            self.events.append("barrier")
        def heap_bases(self):
            return None
        def grid(self, total, persistent, *more):
            return 1 if persistent else total
        def stream(self, i, *more):
            self.events.append(f"stream {i}")
            return contextlib.nullcontext()
        def join_streams(self):
            self.events.append("join")

    out = {}
    for path in sys.argv[1:]:
        name = path.rsplit("/", 1)[-1][:-3]
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        ctx = Ctx()

        def record(self, grid, ctx=ctx):
            def run(*args, **kw):
                ctx.events.append(f"launch {self.__name__} grid={grid[0]} args={len(args)}")
            return run

        for k, *_ in mod.KERNELS:
            type(k).__getitem__ = record
        launch.warmup(ctx, mod, {})
        bufs = {"A": None, "B": None, "C": None, "Ag": None, "ERR": None, "EPOCH": None, "F_Ag_gather": None}
        launch.launch(ctx, mod, bufs, 1)
        out[name] = {
            "schedule": mod.SCHEDULE, "world": mod.WORLD, "tensors": {k: list(v) for k, v in mod.TENSORS.items()},
            "flags": {k: list(v) for k, v in mod.FLAGS.items()},
            "kernels": [[k.__name__, *rest] for k, *rest in mod.KERNELS],
            "exit_barrier": getattr(mod, "EXIT_BARRIER", None),
            "events": ctx.events,
        }
    out["imported"] = sorted(m for m in sys.modules if m.startswith("tilec"))
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def saved_modules(progs, tmp_path_factory):
    """Every schedule's source saved with prog.save, imported in one fresh interpreter (cwd: a temporary folder,
    TRITON_INTERPRET=1, no generated-module cache); what the modules declare and what tilec.runtime.launch does with
    them."""
    d = tmp_path_factory.mktemp("saved")
    paths = []
    for s, prog in progs.items():
        p = d / f"ag_gemm_{s.replace('-', '_')}.py"
        prog.save(p)
        assert p.read_text() == prog.source
        paths.append(str(p))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", _PROBE, *paths], cwd=d, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_saved_module_imports_on_its_own(saved_modules):
    # the module is the program: it imports its fixed device functions (tilec.device); tilec.runtime.launch runs it
    assert "tilec.device" in saved_modules.pop("imported")
    assert {m["schedule"] for m in saved_modules.values()} == set(SCHEDULES)
    for m in saved_modules.values():
        assert m["world"] == 2
        assert m["tensors"]["A"] == ["in", "f16", [128, 128], True]
        assert m["tensors"]["C"] == ["out", "f16", [256, 192], False]


def test_bsp_barriers_between_kernels(saved_modules):
    m = saved_modules["ag_gemm_bsp"]
    assert [k[4] for k in m["kernels"]] == [False, True]  # (kernel, tasks, persistent, concurrent, barrier_before, .)
    assert m["flags"] == {}
    # each kernel gets its buffers (from the KERNELS table), then ERR, heap_bases, rank, epoch, timeout_ns, EPOCH_AT,
    # NPROG: gather reads A and writes Ag (2 + 7), gemm reads Ag and B and writes C (3 + 7)
    assert m["events"] == ["barrier", "stream 0", "launch k0_gather grid=16 args=9",
                           "barrier", "stream 0", "launch k1_gemm grid=12 args=10", "join"]


# a call ends with a barrier only where peers still touch this rank's inputs/outputs after the last barrier: where
# the gather still pulls A from peers (flags, specialized) or the GEMM does (fused-pull)
EXIT_BARRIER = {"bsp": False, "flags": True, "fused-pull": True, "fused-push": False, "specialized": True}


@pytest.mark.parametrize("schedule", [s for s in SCHEDULES if s != "bsp"])
def test_fine_grained_schedules_have_no_barrier_between_kernels(saved_modules, schedule):
    m = saved_modules[f"ag_gemm_{schedule.replace('-', '_')}"]
    assert not any(k[4] for k in m["kernels"])  # no barrier_before entry
    assert all(k[2] for k in m["kernels"])  # persistent
    ev = m["events"]
    launches = [i for i, e in enumerate(ev) if e.startswith("launch")]
    assert len(launches) == len(m["kernels"])
    assert ev[0] == "barrier" and "barrier" not in ev[1:launches[-1]]  # only the entry barrier before the kernels
    assert m["exit_barrier"] is EXIT_BARRIER[schedule]
    assert ev[launches[-1] + 1:] == (["join", "barrier"] if m["exit_barrier"] else ["join"])
    if schedule == "flags":  # two kernels on their own streams
        assert [e for e in ev if e.startswith("stream")] == ["stream 0", "stream 1"]
        (size, count, producer, _key, number) = m["flags"]["F_Ag_gather"]  # counters, count, producer, key, no.
        assert list(m["flags"]) == ["F_Ag_gather"] and producer == "gather" and number == 1 and size * count == 16
    if schedule == "fused-pull":
        assert "Ag" not in m["tensors"] and m["flags"] == {}


def test_bsp_has_no_exit_barrier(saved_modules):
    assert saved_modules["ag_gemm_bsp"]["exit_barrier"] is False


def test_flash_decode_source_golden(golden):
    """The single persistent flash-decode kernel with splits longer than one block: attend streams 64-key blocks
    (masked past the sequence's length) through tl.dot with the query rows padded to 16."""
    prog = tilec.compile("examples/flash_decode.tile", world=2, schedule="fused-push",
                         dims=dict(B=2, HKV=2, G=4, D=64, S=256, BS=128))
    golden("flash_decode_w2/fused-push.source.py", prog.source)
    assert "for kb in range(0, 128, 64):  # blocks of keys" in prog.source and "td.attend_step(" in prog.source


def test_flash_decode_splits_source_golden(golden):
    """The free split count: 3 splits of 96 keys in 128-key tiles, streamed in 64-key blocks up to the split's 96
    keys (not its tile's 128), the valid count clamped to them; the local merge of 3 partials padded to 4."""
    prog = tilec.compile("examples/flash_decode_splits.tile", world=2, schedule="fused-push",
                         dims=dict(B=2, HKV=2, G=4, D=64, S=280, NS=3, L=96, BS=128))
    golden("flash_decode_splits_w2/fused-push.source.py", prog.source)
    assert "for kb in range(0, 128, 64):  # blocks of keys" in prog.source  # 96 keys: two blocks, the second half
    assert re.search(r"n_keys = tl.minimum\(.*, 96\)\n", prog.source)  # this split's keys, at most its 96 rows
    assert "td.lse_merge(tl.reshape(os_tile, (4, 1, 64)), tl.reshape(ls_tile, (4, 1)), 3)" in prog.source

