"""backend="nvshmem" with several nodes (ranks_per_node < world) on the CPU emulation: peers off a rank's node are
reached only by gets, puts and signal words (tilec/device_nvshmem.py copies them through the shared-memory heap at
the peer's own mapping), so a pointer access to an off-node peer reads this rank's own copy and fails here.

Every example and a few generated programs run at worlds 2-4 with ranks_per_node 1, 2 and the world, against the
reference interpreter (examples) and the generated programs' own torch model; the printed kernels, the option
errors and the verifier rule (passes/verify/nodes.py) are checked on their own."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

import tilec
from tests import _workers
from tests._util import make_calls, rel_err
from tests.gen_programs import generate
from tilec.errors import ArgumentError, ScheduleError, TilecError
from tilec.ir.nodes import off_node_peers
from tilec.passes.base import run_pipeline
from tilec.passes.lower import Lower
from tilec.passes.schedules import pipeline
from tilec.passes.verify import nodes, structure, verify
from tilec.passes.verify.context import Ctx
from tilec.run_vs_reference import compare_calls
from tilec.runtime import spawn

SMALL_EXAMPLES = ("ag_gemm", "gemm_rs", "gemm_ar", "flash_decode", "flash_decode_splits")  # moe: its own inputs


def small(example: str, world: int) -> dict:
    """Sizes that keep the interpreter quick: a tile or two per rank."""
    if example.startswith("flash_decode"):
        fd = {"B": 1, "HKV": 2, "G": 2, "D": 32, "BS": 32}
        return fd | ({"S": 40, "NS": 2, "L": 20} if example.endswith("splits") else {"S": 64})
    return {"M": 32 * world, "N": 32, "K": 16 * world, "BM": 16, "BN": 32, "BK": 16}


# world -> [(ranks_per_node, example, schedule)]: every example, every schedule kind and ranks_per_node 1, 2, world
# (and the copy engines on one node, whose 4-byte epoch writes set the low half of a 64-bit signal word); a fourth
# item overrides sizes (BM 64 at world 3: a tile over two ranks' rows, td.remote_get, a ragged last tile)
RUNS = {
    2: [(1, "ag_gemm", "fused-push"), (1, "flash_decode", "fused-push"),
        (2, "ag_gemm", "fused-pull"), (2, "ag_gemm", "flags+dma")],
    3: [(1, "ag_gemm", "fused-pull", {"BM": 64}), (1, "gemm_rs", "flags"), (3, "gemm_ar", "bsp")],
    4: [(2, "ag_gemm", "fused-push"), (2, "gemm_rs", "fused-push"), (2, "flash_decode_splits", "flags")],
}
GENERATED = {2: (31, "fused-pull"), 3: (7, "fused-push"), 4: (12, "specialized")}  # world -> (seed, schedule), rpn 1


def _compile(example, world, schedule, rpn, dims=None, **kw):
    schedule, _, transport = schedule.partition("+")  # flags+dma: the copy stages on the copy engines (one node)
    dims = small(example, world) | (dims or {})
    return tilec.compile(f"examples/{example}.tile", world=world, schedule=schedule, dims=dims,
                         backend="nvshmem", ranks_per_node=rpn, transport=transport or "sm",
                         **{"wait_timeout": 30, **kw})


def _generated(world):
    seed, schedule = GENERATED[world]
    for s in range(seed, seed + 40):  # the first program of a seed the schedule applies to
        g = generate(s, world, focus=True)
        try:
            return g, tilec.compile(f"tests/generated/{g.name}.tile", world, schedule, source=g.text,
                                    backend="nvshmem", ranks_per_node=1, wait_timeout=30)
        except ScheduleError:
            continue
    raise AssertionError("no generated program")


@pytest.mark.slow
@pytest.mark.usefixtures("no_shm_leftovers")
@pytest.mark.parametrize("world", sorted(RUNS))
def test_examples_and_generated_programs_across_nodes(world, monkeypatch):
    batch, meta = [], {}
    for rpn, example, schedule, *dims in RUNS[world]:
        prog = _compile(example, world, schedule, rpn, *dims)
        if dims:
            assert "td.remote_get(" in prog.source
        calls = make_calls(prog, 2, seed=world * 10 + rpn, positive=("lens",))
        if "lens" in prog.signature():  # sequence lengths: integers within the cache
            for per_rank in calls:
                for d in per_rank:
                    d["lens"] = torch.randint(1, dict(prog.program.dims)["S"] * world + 1, d["lens"].shape,
                                              dtype=torch.int32)
        key = (example, schedule, rpn)
        batch.append((key, prog, calls, ()))
        meta[key] = (prog, calls)
    moe_ref = None
    if world == 4:  # examples/moe.tile: a data-dependent gather of a peer's rows, off the node, and back
        from tests.test_rows import _moe_case

        inputs, moe_ref, _ = _moe_case(world, 24, 2, 16, 2, "any", seed=10)
        mprog = tilec.compile("examples/moe.tile", world=world, schedule="flags", dims={"T": 24, "K": 2},
                              backend="nvshmem", ranks_per_node=2, wait_timeout=30)
        assert "td.get(" in mprog.source and "td.wait_peer(" in mprog.source
        batch.append((("moe", "flags", 2), mprog, [inputs], ()))
    g, gprog = _generated(world)
    gcalls = make_calls(gprog, 2, seed=world)
    batch.append((("generated", g.name, 1), gprog, gcalls, g.plain))
    monkeypatch.setenv("TILEC_CPU_ADVERSARY", "0.02")  # a rank starts late: waits on off-node flags really wait
    results = spawn(_workers.run_cases, world, heap_bytes=1 << 24, timeout=600, args=(batch,))
    for key, (prog, calls) in meta.items():
        rows = compare_calls(prog, [results[r][key] for r in range(world)], calls)
        bad = [r for r in rows if not r.ok]
        assert not bad, (key, bad[:3])
    for r in range(world if moe_ref is not None else 0):
        assert rel_err(results[r][("moe", "flags", 2)][0]["O"], moe_ref[r]) < 2e-2, r
    for c, ins in enumerate(gcalls):
        for r, want in enumerate(g.expect(ins)):
            got = results[r][("generated", g.name, 1)][c]
            for out, (value, mask) in want.items():
                assert rel_err(got[out].float()[mask], value[mask]) <= g.tol, (g.name, r, c, out)


# -- what is printed ----------------------------------------------------------------------------------------------
def _peer_offset_names(src: str) -> set[str]:
    return set(re.findall(r"(\w+) = td\.peer_offset\(", src))


@pytest.mark.parametrize("example,schedule", [("ag_gemm", "fused-push"), ("ag_gemm", "fused-pull"),
                                              ("gemm_rs", "fused-push"), ("flash_decode", "specialized"),
                                              ("gemm_ar", "flags")])
def test_off_node_accesses_print_as_gets_puts_and_signals(example, schedule):
    src = _compile(example, 4, schedule, 2).source
    offsets = _peer_offset_names(src)
    for line in src.splitlines():  # no pointer load or store through a peer offset, no Iris translation
        if re.search(r"\btl\.(load|store)\(", line):
            assert not any(re.search(rf"\b{o}\b", line) for o in offsets), line
        assert "iris." not in line, line
    assert "import tilec.device_nvshmem as td" in src and "RANKS_PER_NODE = 2" in src
    remote = offsets or "td.remote_get(" in src
    assert remote and re.search(r"td\.(get|put|remote_get)\(", src), src
    if "F_" in src and schedule == "fused-push":  # pushes release the peers' signal words
        assert "td.signal(" in src


def test_one_node_prints_as_iris_does():
    iris = tilec.compile("examples/ag_gemm.tile", world=4, schedule="fused-push").source
    one = tilec.compile("examples/ag_gemm.tile", world=4, schedule="fused-push", backend="nvshmem").source
    assert "td.get(" not in one and "td.put(" not in one and "RANKS_PER_NODE = 4" in one

    def body(src):  # the kernels and tables, without the lines naming the backend
        return [ln for ln in src[src.index("\nWORLD = "):].splitlines() if not ln.startswith(("BACKEND", "RANKS"))]

    assert body(one) == body(iris)
    assert "backend=nvshmem" in one.splitlines()[6] and "backend" not in iris.splitlines()[6]


def test_options_are_in_the_header_and_the_cache_key():
    a = _compile("ag_gemm", 4, "fused-push", 2)
    b = _compile("ag_gemm", 4, "fused-push", 1)
    assert a.options.backend == "nvshmem" and a.options.ranks_per_node == 2
    assert "ranks_per_node=2" in a.source and "ranks_per_node=1" in b.source
    assert "ranks_per_node=2" in a.options.line()
    assert max(len(ln) for ln in a.source.splitlines()) <= 120


# -- errors -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,says", [
    ({"backend": "nvshmem", "ranks_per_node": 3}, "ranks_per_node=3: must divide the world (4 ranks)"),
    ({"backend": "nvshmem", "ranks_per_node": -1}, "ranks_per_node=-1"),
    ({"backend": "nvshmem", "ranks_per_node": "2"}, "ranks_per_node='2'"),
    ({"ranks_per_node": 2}, "ranks_per_node=2: backend 'iris' reaches every peer by pointer"),
    ({"backend": "shmem"}, "backend='shmem': expected one of iris, nvshmem"),
    ({"backend": "nvshmem", "wait_sleep_ns": 100}, "wait_sleep_ns=100"),
])
def test_bad_options_name_the_argument(kw, says):
    with pytest.raises(ArgumentError, match=re.escape(says)):
        tilec.compile("examples/ag_gemm.tile", world=4, schedule="flags", **kw)


@pytest.mark.parametrize("schedule", ["flags", "auto"])
@pytest.mark.parametrize("backend,per_node,kernels", [
    (None, 2, "nvshmem"),  # nodes alone imply NVSHMEM's kernels
    ("nvshmem", 2, "nvshmem"),
    ("iris", 4, "iris"),  # one node of 4: Iris as asked
    ("iris", 2, None),  # an explicit Iris with several nodes: refused, never turned into NVSHMEM
    ("iris", 1, None),
])
def test_command_line_backend_and_nodes(tmp_path, capsys, schedule, backend, per_node, kernels):
    from tilec.cli import main

    out = tmp_path / "k.py"
    argv = ["compile", "examples/ag_gemm.tile", "--world", "4", "-s", schedule, "--ranks-per-node", str(per_node),
            "-o", str(out), *(["--backend", backend] if backend else [])]
    code = main(argv)
    err = capsys.readouterr().err
    if kernels is None:
        assert code == 2 and not out.exists()
        assert f"ranks_per_node={per_node}: backend 'iris' reaches every peer by pointer" in err, err
    else:
        assert code == 0, err
        text = out.read_text()
        assert ('BACKEND = "nvshmem"' in text) == (kernels == "nvshmem"), text[:1200]
        assert (f"RANKS_PER_NODE = {per_node}" in text) == (per_node < 4)


@pytest.mark.parametrize("schedule", ["flags", "fused-push"])
@pytest.mark.parametrize("per_node", [1, 2])
def test_copy_engines_across_nodes_are_a_schedule_refusal(schedule, per_node):
    # refused by the transport pass, naming the option (what `tilec check` lists), before the verifier's nodes rule
    with pytest.raises(ScheduleError) as e:
        _compile("ag_gemm", 4, f"{schedule}+dma", per_node)
    text = str(e.value)
    assert text.startswith("transport=dma:") and f"ranks_per_node={per_node} of 4 ranks" in text, text
    _compile("ag_gemm", 4, f"{schedule}+dma", 4)  # one node: the copy engines reach every peer


SMALL_DMA = """program small(world W)
  dims  M = 16, N = 8
  tiles BM = 8, BN = 8
  in  A  : f32[M/W, N] symmetric
  out C  : f32[M, N]
  buf Ag : f32[M, N] symmetric
  stage gather over r in ranks, m in M/W by BM, n in N by BN:
    Ag[r*M/W + m, n] = A@r[m, n]
  barrier
  stage scale over m in M by BM, n in N by BN:
    C[m, n] = Ag[m, n] * 2
"""


def test_nodes_rule_alone():
    from tilec.frontend.parser import parse
    from tilec.frontend.sema import check

    g = run_pipeline(Lower()(check(parse(SMALL_DMA, "small.tile"), 4)), pipeline("flags", "tile", transport="dma"),
                     verify)

    def problems(per_node):
        h = g.copy()
        h.graph = dict(g.graph, ranks_per_node=per_node)
        ctx = Ctx(h)
        structure.check(ctx)  # the graph's facts (its stages) every rule reads
        assert ctx.problems == []
        ctx.rule = "nodes"
        nodes.check(ctx)
        return ctx.problems

    assert problems(4) == [] and problems(None) == []
    got = problems(2)
    assert len(got) == 1 and got[0].kind == "nodes" and got[0].loc.line == 8, got
    assert "rank 0 reads A of rank 2, off its node (ranks_per_node=2)" in got[0].message
    assert off_node_peers(1, 4, 2) == [2, 3] and off_node_peers(0, 4, 4) == []


def test_missing_gpu_or_nvshmem_is_a_clear_error():
    from tilec.runtime.nvshmem_heap import NvshmemHeap, _check_gpus

    with pytest.raises(TilecError, match="needs torch.distributed initialized first"):
        NvshmemHeap()
    if not torch.cuda.is_available():
        with pytest.raises(TilecError, match="backend nvshmem needs a CUDA GPU"):
            _check_gpus(2)


def test_node_bases_table():
    from tilec.runtime.nvshmem_launch import node_bases

    bases = torch.tensor([100, 200, 300, 400], dtype=torch.int64)
    assert node_bases(bases, 2, 2).tolist() == [300, 300, 300, 400, 100, 200, 300, 400]
    assert node_bases(bases, 1, 1).tolist() == [200, 200, 200, 200, 100, 200, 300, 400]


def test_capture_across_nodes_is_refused():
    """capture() refuses a program compiled for several nodes, and the bench (measure.capturable) times its eager
    calls instead of asking for a graph (it had failed the schedule with capture's refusal)."""
    from tilec.perf.measure import capturable

    prog = _compile("ag_gemm", 2, "fused-push", 1)

    class FakeHeap:  # capture refuses before it touches a heap that is not on the CPU
        interpret = False

    prog.__dict__["_state"] = {}
    with pytest.raises(ArgumentError, match="compiled for several nodes"):
        prog.capture(FakeHeap())
    assert not capturable(prog, FakeHeap())
    one_node = _compile("ag_gemm", 2, "fused-push", 2)
    one_node.__dict__["_state"] = {}
    assert capturable(one_node, FakeHeap())
    assert dataclasses.replace(prog.options, ranks_per_node=0).line() != prog.options.line()


@pytest.mark.parametrize("example, schedule, dims", [
    ("ag_gemm", "fused-push", None), ("ag_gemm", "fused-pull", None),
    ("gemm_rs", "fused-push", None),  # a put of a 3-d tile, then a put-with-signal of no bytes
    ("flash_decode", "fused-push", None), ("ring_ag_gemm", "fused-push", {"M": 128, "N": 64, "K": 32}),
    ("moe", "flags", {"T": 24, "K": 2})])
def test_gpu_branches_compile_to_ptx_with_only_nvshmem_left_to_link(example, schedule, dims):
    """Triton's real GPU pipeline (no GPU needed) takes the off-node paths of device_nvshmem.py down to PTX; what
    ptxas then misses is only NVSHMEM's device library, which a GPU launch links (runtime/nvshmem_launch.py). The
    GPU compiles the same declarations (device_nvshmem.py declares every NVSHMEM call itself)."""
    from tilec.codegen.target_check import compile_for_target

    def build(rpn):
        if dims is None:
            return _compile(example, 2, schedule, rpn)
        return tilec.compile(f"examples/{example}.tile", world=2, schedule=schedule, dims=dims, backend="nvshmem",
                             ranks_per_node=rpn)

    with pytest.raises(TilecError, match=r"Unresolved extern function 'nvshmemx?_\w+'"):
        compile_for_target(build(1), "cuda:90")
    assert compile_for_target(build(2), "cuda:90")  # pointers only: it links as Iris kernels do


def test_device_module_exports_what_the_printed_kernels_call():
    import triton

    import tilec.device as td
    import tilec.device_nvshmem as tdn

    jitted = [n for n, v in vars(td).items() if isinstance(v, triton.runtime.jit.JITFunction)]
    assert "program_major" in jitted and "first_task" in jitted
    assert all(getattr(tdn, n, None) is getattr(td, n) for n in jitted)  # imported, not copied
    called = set()
    for example in SMALL_EXAMPLES:
        for schedule in ("bsp", "flags", "fused-pull", "fused-push", "specialized"):
            try:
                called |= set(re.findall(r"\btd\.(\w+)\(", _compile(example, 4, schedule, 2).source))
            except ScheduleError:
                continue
    straddling = tilec.compile("examples/ag_gemm.tile", 4, "fused-pull", {"M": 128, "N": 64, "K": 64},
                               backend="nvshmem", ranks_per_node=2).source  # a 64-row tile over two ranks' rows
    called |= set(re.findall(r"\btd\.(\w+)\(", straddling))
    assert {"get", "put", "signal", "remote_get", "wait_peer"} <= called
    assert all(isinstance(getattr(tdn, n, None), triton.runtime.jit.JITFunction) for n in called), called


@pytest.mark.slow
@pytest.mark.usefixtures("no_shm_leftovers")
def test_a_wait_on_an_off_node_flag_times_out_with_the_usual_message():
    """Rank 1 calls again while rank 0 stands in its entry barrier: rank 1's waits on rank 0's signal words, polled
    by gets across "nodes" (td.wait_peer), end after the wall-clock timeout as a WaitTimeout naming the flag."""
    from tests.test_wait_timeout import late_call

    prog = _compile("flash_decode", 2, "flags", 1, wait_timeout=2.0)
    assert "td.wait_peer(" in prog.source
    inputs = make_calls(prog, 1, seed=5)[0]
    for d in inputs:
        d["lens"] = torch.full(d["lens"].shape, 100, dtype=torch.int32)
    _, (elapsed, msg) = spawn(late_call, 2, heap_bytes=1 << 22, timeout=240, args=(prog, inputs))
    assert msg is not None and "waited on flag" in msg and "on rank 0" in msg, msg
    assert 2.0 <= elapsed < 20, elapsed


def test_only_kernels_that_call_nvshmem_take_its_name_and_library():
    """A kernel with no NVSHMEM call has no NVSHMEM device state in its module, and NVSHMEM's module init fails on it
    ('named symbol not found'): only kernels that call NVSHMEM are named *_nvshmem, and only those launch with its
    device library (runtime/launch.extern_libs)."""
    from types import SimpleNamespace

    from tilec.runtime.launch import _needs_nvshmem

    prog = tilec.compile("examples/ag_gemm.tile", world=2, schedule="bsp", backend="nvshmem", ranks_per_node=1)
    kernels = re.findall(r"^def (k\d+_\w+)\(", prog.source, re.M)
    named = {k: k.endswith("_nvshmem") for k in kernels}
    assert named == {"k0_gather_nvshmem": True, "k1_gemm": False}, named
    gemm_body = prog.source.split("def k1_gemm(")[1]
    assert "td.get(" not in gemm_body and "td.put(" not in gemm_body and "td.signal(" not in gemm_body
    assert _needs_nvshmem(SimpleNamespace(fn=SimpleNamespace(__name__="k0_gather_nvshmem")))
    assert not _needs_nvshmem(SimpleNamespace(fn=SimpleNamespace(__name__="k1_gemm")))


def test_an_out_of_range_routing_index_is_an_error_across_nodes():
    """examples/moe.tile on backend nvshmem with one rank per node (the dispatch gathers token rows from a peer off
    the node by gets): a routing table naming a token row that does not exist is an IndexRangeError naming the
    tensor, the element and the value on every rank, never a get of other memory; the next call runs right."""
    from tests.test_rows import _close, _moe_case

    inputs, ref, _ = _moe_case(2, 24, 2, 16, 2, "any", seed=4)
    bad = [dict(d) for d in inputs]
    bad[1]["src"] = bad[1]["src"].clone()
    bad[1]["src"][3] = 977  # rank 1 owns slot 3, of sending rank 0: X@0 has 24 rows
    prog = tilec.compile("examples/moe.tile", world=2, schedule="flags", dims={"T": 24, "K": 2}, backend="nvshmem",
                         ranks_per_node=1, wait_timeout=30)
    got = spawn("tests._rows_workers:calls_or_errors", 2, args=([("moe", prog, [bad, inputs])],), heap_bytes=1 << 24,
                timeout=300)
    assert "index out of range: src[3] = 977 is not a row of dim 0 of 'X' (0..23)" in got[1]["moe"][0], got[1]["moe"][0]
    for rank in range(2):
        _close(got[rank]["moe"][1]["O"], ref[rank], rank)


@pytest.mark.parametrize("rank", [0, 1])
def test_kernels_that_call_nvshmem_keep_the_call_on_every_rank(rank, capfd):
    """Triton compiles an integer argument of 1 as a constant: at world 4 with 2 ranks per node, rank 1's ring peer
    (rank 0) is on its node, so a kernel specialized for rank 1 would hold no NVSHMEM call, and NVSHMEM's module init
    fails on it on the GPU ('named symbol not found'). Compiled as rank 1's launch would be, it still calls NVSHMEM:
    ptxas misses NVSHMEM's device library, which a GPU launch links."""
    from tilec.codegen.target_check import compile_for_target

    prog = tilec.compile("examples/ring_all_gather.tile", world=4, schedule="bsp", dims={"M": 256, "K": 64},
                         backend="nvshmem", ranks_per_node=2)
    with pytest.raises(TilecError, match=r"k1_ring_0_nvshmem .*Unresolved extern function 'nvshmem_int16_g'"):
        compile_for_target(prog, "cuda:90", rank=rank)
    capfd.readouterr()  # Triton prints the PTX of a failed ptxas run
