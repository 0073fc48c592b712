"""tilec programs as PyTorch ops (tilec.op): shapes, arguments and heap sizing in this process; calls at world 2
(spawned CPU ranks and torchrun) against torch, under torch.compile, with heap and plain inputs, and the TP block of
examples/tp_block.py against the unsharded model."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import uuid

import pytest
import torch

import tilec
from tests._util import ROOT
from tilec.errors import ArgumentError
from tilec.runtime import HeapError

EX = ROOT / "examples"


# -- in this process: no kernel runs ------------------------------------------------------------------------------


def _meta(*shape, dtype=torch.float16):
    return torch.empty(shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_fake_kernel_shapes_follow_the_inputs(world, rows):
    """Output shapes of the fake kernel, from the declarations under dims bound from the inputs, against what the
    torch computation of each program returns (sizes written independently here)."""
    ag = tilec.op(EX / "ag_gemm.tile", name=f"f_ag_w{world}", world=world)
    rs = tilec.op(EX / "gemm_rs.tile", name=f"f_rs_w{world}", world=world)
    fd = tilec.op(EX / "flash_decode.tile", name=f"f_fd_w{world}", world=world)
    k, n = 24, 40
    assert ag(_meta(rows, k), _meta(k, n)).shape == (rows * world, n)  # all_gather(A) @ B
    assert rs(_meta(rows * world, k), _meta(k, n)).shape == (rows, n)  # rows of the reduced product
    b, hkv, g, d, s = rows, 2, 3, 16, 32
    o = fd(_meta(b, hkv * g, d), _meta(b, hkv, s, d), _meta(b, hkv, s, d), _meta(b, dtype=torch.int32))
    assert o.shape == (b, hkv * g, d) and o.dtype == torch.float16


def test_fake_kernel_under_symbolic_shapes():
    """torch.compile traces through the fake kernel with dynamic sizes (no kernel runs: meta tensors)."""
    ag = tilec.op(EX / "ag_gemm.tile", name="f_ag_dyn", world=2)

    def f(a, b):
        return ag(a, b).sum(0)

    g = torch.compile(f, backend="eager", fullgraph=True, dynamic=True)
    for rows in (3, 8):
        assert g(_meta(rows, 16), _meta(16, 8)).shape == (8,)
    assert hasattr(torch.ops.tilec, "f_ag_dyn")


def test_traced_graphs_name_the_world_and_the_program():
    """A traced graph holds each op call's variant ("w<world>:<digest of the program and settings>"): Inductor's
    on-disk caches key on the graph, and the outputs' shapes depend on both, so a model compiled at world 1 must
    not be reused at world 2 (it was, on an H200: a size check failed), nor after the .tile program changed."""
    graphs = []

    def keep(gm, _inputs):
        graphs.append(gm.code)
        return gm.forward

    src = (EX / "ag_gemm.tile").read_text()
    ops = {w: tilec.op(source=src, name=f"f_ag_var{w}", world=w) for w in (1, 2)}
    changed = tilec.op(source=src.replace("BM = 64", "BM = 32"), name="f_ag_var_changed", world=2)
    for op in (*ops.values(), changed):
        torch.compile(lambda a, b, op=op: op(a, b) * 2, backend=keep, fullgraph=True)(_meta(4, 16), _meta(16, 8))
    assert len(graphs) == 3
    assert f"'w1:{ops[1].digest}'" in graphs[0] and f"'w2:{ops[2].digest}'" in graphs[1]
    assert len({ops[1].digest, ops[2].digest, changed.digest}) == 3


@pytest.mark.parametrize(("kw", "needle"), [
    ({"dims": {"N": "256"}}, "dims['N'] = '256': must be an int, got str"),
    ({"dims": {"N": 2.0}}, "dims['N'] = 2.0: must be an int, got float"),
    ({"dims": {"N": True}}, "dims['N'] = True: must be an int"),
    ({"dims": {"N": 0}}, "dims['N'] = 0: must be >= 1"),
    ({"dims": {"Q": 4}}, "no dim or tile size named 'Q'"),
    ({"dims": [("N", 4)]}, "must be a dict"),
    ({"world": "2"}, "world = '2': must be an int"),
    ({"name": "not an id"}, "must be a Python identifier"),
    ({"barrier": "host"}, "barrier='host': expected one of auto, device"),
])
def test_bad_python_arguments_raise_argument_errors(kw, needle):
    with pytest.raises(ArgumentError, match=re.escape(needle)):
        tilec.op(EX / "ag_gemm.tile", **{"name": "bad_args", **kw})


def test_tilec_compile_names_the_bad_dim():
    with pytest.raises(ArgumentError, match=re.escape("dims['M'] = '256': must be an integer, not str")):
        tilec.compile(EX / "ag_gemm.tile", world=2, dims={"M": "256"})


def test_bad_call_arguments_name_the_input():
    ag = tilec.op(EX / "ag_gemm.tile", name="f_ag_calls", world=2)
    rs = tilec.op(EX / "gemm_rs.tile", name="f_rs_calls", world=2)
    cases = [
        (lambda: ag(_meta(4, 8), _meta(9, 8)), "input 'B' has shape [9, 8], the program declares [8, 8]"),
        (lambda: ag(_meta(4, 8), _meta(8, 8, dtype=torch.float32)), "input 'B' has dtype float32"),
        (lambda: ag(_meta(4, 8)), "missing input(s) B"),
        (lambda: ag(_meta(4, 8), _meta(8, 8), C=_meta(1)), "unexpected argument 'C'"),
        (lambda: ag(_meta(4, 8), [[1.0]]), "input 'B' must be a torch.Tensor"),
        (lambda: ag(_meta(4, 8, 1), _meta(8, 8)), "input 'A' has 3 dims"),
        (lambda: rs(_meta(5, 8), _meta(8, 8)), "'C' would have size 5/2 along axis 0"),  # M=5 rows over 2 ranks
    ]
    for call, needle in cases:
        with pytest.raises(ArgumentError, match=re.escape(needle)):
            call()


def test_an_op_name_is_registered_once():
    a = tilec.op(EX / "ag_gemm.tile", name="f_once", world=2)
    assert tilec.op(EX / "ag_gemm.tile", name="f_once", world=2) is a
    assert torch.ops.tilec.f_once is not None
    with pytest.raises(ArgumentError, match="already registered with other settings"):
        tilec.op(EX / "ag_gemm.tile", name="f_once", world=4)
    with pytest.raises(ArgumentError, match="no default and no input's shape determines it"):
        tilec.op(source="program p(world W)\n  dims M, N\n  tiles BM = 16\n  in A : f32[M]\n  out C : f32[N]\n"
                 "  stage s over m in N by BM:\n    C[m] = A[m]\n", name="f_undetermined")


def test_heap_bytes_cover_buffers_flags_and_staging():
    """Independent count for ag_gemm under fused-push: staging for A [M/W, K], flags, and no Ag buffer left (the
    gather is fused into pushes, which still land in Ag on the owner)."""
    ag = tilec.op(EX / "ag_gemm.tile", name="f_heap", world=2)
    small, big = ag.heap_bytes(2, M=64, N=32, K=32), ag.heap_bytes(2, M=4096, N=32, K=32)
    a_bytes, ag_bytes = 4096 // 2 * 32 * 2, 4096 * 32 * 2
    assert big - small >= (a_bytes + ag_bytes) - (32 * 32 * 2 + 64 * 32 * 2)
    assert ag.heap_bytes(2, A=(2048, 32), B=(32, 32)) == big  # by input shapes, the same variant
    assert big < 2 * (a_bytes + ag_bytes)  # nothing counted twice


def test_an_op_that_does_not_fit_names_the_bytes(tmp_path):
    """Before any kernel runs: the op's first call checks what is left of the heap."""
    from tilec.runtime.cpu_heap import ShmHeap, create_shm_files, unlink_quietly

    paths = create_shm_files(1, 1 << 16, f"{os.getpid()}_{uuid.uuid4().hex[:8]}")
    try:
        heap = ShmHeap(0, 1, paths, 1 << 16)
        ag = tilec.op(EX / "ag_gemm.tile", name="f_fit", world=1)
        with tilec.runtime.use_heap(heap), pytest.raises(HeapError) as e:
            ag(torch.zeros(512, 64, dtype=torch.float16), torch.zeros(64, 64, dtype=torch.float16))
        need = ag.heap_bytes(1, M=512, N=64, K=64)
        assert f"needs {need} B more of the symmetric heap on rank 0" in str(e.value)
        assert "heap_bytes=" in str(e.value) and heap.used == 0  # nothing allocated
        heap.close()
    finally:
        unlink_quietly(paths)


def test_empty_checks_its_arguments():
    with pytest.raises(ArgumentError, match="is not a torch.dtype"):
        tilec.empty((2, 2), "f16")
    with pytest.raises(ArgumentError, match="negative size"):
        tilec.empty((2, -1), torch.float16)


def test_compiled_program_repr_is_one_line():
    p = tilec.compile(EX / "ag_gemm.tile", world=2, schedule="fused-push", dims={"M": 128})
    assert repr(p) == ("<CompiledProgram ag_gemm schedule=fused-push world=2 dims(M=128, N=192, K=128, BM=64, BN=64,"
                       " BK=32)>")


def test_version_flag():
    out = subprocess.run([sys.executable, "-m", "tilec", "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"tilec {tilec.__version__}"


# -- world 2: spawned CPU ranks -----------------------------------------------------------------------------------

BLOCK = {"hidden": 64, "inter": 128, "tokens": 64, "retokens": [32], "layers": 2, "batch": 2, "kv_heads": 2,
         "group": 2, "head_dim": 32, "seq": 128, "dtype": "f16", "iters": 0, "seed": 3}


@pytest.fixture(scope="module")
def world2():
    cases = {"shapes": [(64, 48, 32), (36, 40, 24)], "compile_m": [64, 32, 64], "block": BLOCK}
    return tilec.runtime.spawn("tests._ops_workers:ops_world", 2, heap_bytes=16 << 20, args=(cases,), timeout=900)


@pytest.mark.slow
def test_ops_match_torch_at_world_2(world2):
    for res in world2:
        for what, m, err in res["eager"]:
            assert err < 2e-2, (what, m, err)


@pytest.mark.slow
def test_torch_compile_traces_ops_and_a_new_shape_compiles_a_variant(world2):
    for res in world2:
        (m0, e0, new0), (m1, e1, new1), (m2, e2, new2) = res["compile"]
        assert max(e0, e1, e2) < 2e-2
        assert new0 == (1, 1) and new1 == (1, 1)  # each new M: one new variant of each op
        assert m2 == m0 and new2 == (0, 0)  # an M seen before reuses its variant


@pytest.mark.slow
def test_heap_inputs_are_used_in_place_and_others_copied(world2):
    for res in world2:
        p = res["placement"]
        assert p["heap"] == (True, 0)  # the program ran on the caller's heap tensor, no copy
        assert p["plain"] == (False, True, 1)  # a plain tensor: copied once, into the heap
        assert p["same"] and p["err"] < 2e-2


@pytest.mark.slow
def test_out_writes_the_callers_tensors(world2):
    for res in world2:
        o = res["out"]
        assert o["plain"] == (True, True, 0) and o["plain_err"] < 2e-2  # a plain tensor for a plain output: in place
        assert o["strided"] == (False, 1) and o["strided_err"] < 2e-2  # not contiguous: written through a copy
        assert o["sym_heap"] == (True, 0) and o["sym_plain"] == (False, 1)  # symmetric output: in place on the heap
        assert o["sym_err"] == 0.0  # a gather moves bits
        assert o["compiled_err"] < 2e-2


@pytest.mark.slow
def test_an_op_too_big_for_the_heap_fails_on_every_rank(world2):
    for res in world2:
        kind, text = res["too_big"]
        assert kind == "HeapError" and "heap_bytes=" in text and re.search(r"needs \d+ B more", text)


@pytest.mark.slow
@pytest.mark.parametrize("block", ["block", "block_dev"])
def test_tp_block_matches_the_unsharded_model(world2, block):
    """The TP module under torch.compile (eager backend), with host barriers and with device barriers (block_dev),
    and after a shape change (another token count: new op variants, a recompile)."""
    for res in world2:
        b = res[block]
        assert set(b["mlp"]) == {"tilec", "plain", "tilec-compile"}, b
        assert b["mlp_err"] <= 2e-2 * max(1.0, b["scale"]), b
        assert b["mlp_err"] <= 4 * b["plain_err"] + 1e-2, b  # no worse than plain torch TP in the same dtype
        assert b["mlp"]["tilec"]["err"] <= 4 * b["plain_err"] + 1e-2, b
        assert b["decode_err"] < 1e-2 and b["decode_plain_err"] < 1e-2, b
        if block == "block":
            ((tokens, err),) = b["retokens"]
            assert tokens == 32 and err <= 2e-2 * max(1.0, b["scale"]), b


@pytest.mark.slow
def test_a_heap_of_the_size_heap_bytes_gives_is_enough():
    need = tilec.op(EX / "ag_gemm.tile", name="t_ag_gemm_sized", world=2).heap_bytes(2, M=96, N=64, K=64)
    for res in tilec.runtime.spawn("tests._ops_workers:sized_heap", 2, heap_bytes=need, args=(96, 64, 64)):
        assert res["err"] < 2e-2 and res["used"] <= res["capacity"] < need + 8192


# -- torchrun: the script adopts torchrun's process group ---------------------------------------------------------


@pytest.mark.slow
def test_tp_block_under_torchrun_adopts_the_process_group(tmp_path):
    before = set(glob.glob("/dev/shm/tilec_pg_*"))
    run_id = f"tilecops{uuid.uuid4().hex[:12]}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
           "--rdzv-id", run_id, "--nnodes", "1", "--nproc-per-node", "2", str(EX / "tp_block.py"), "--backend", "cpu",
           "--hidden", "32", "--inter", "64", "--tokens", "32", "--layers", "1", "--seq", "64", "--head-dim", "32"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "TILEC_CACHE": str(tmp_path)})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    errs = re.findall(r"max \|err\| vs unsharded: tilec ([\d.e+-]+), plain TP ([\d.e+-]+)", res.stdout)
    assert len(errs) == 2, res.stdout  # the MLP and the decode lines, printed by rank 0 only
    for tilec_err, plain_err in errs:
        assert float(tilec_err) < 5e-2 and float(plain_err) < 5e-2, res.stdout
    assert set(glob.glob("/dev/shm/tilec_pg_*")) - before == set()  # heap files unlinked


# -- the README's example -----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_readme_example_runs(tmp_path):
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Inside a PyTorch model"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    script = tmp_path / "readme_example.py"
    script.write_text(code)
    res = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "TILEC_CACHE": str(tmp_path / "cache"),
                              "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert res.stdout.strip().endswith("ok"), res.stdout


# -- device barriers (the form of a call a CUDA graph can hold), on the CPU emulation ------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_device_barriers_many_calls_match_torch_and_a_missing_rank_times_out(world):
    cases = {"shape": (24 * world, 16, 32), "calls": 4, "timeout": 5.0}
    results = tilec.runtime.spawn("tests._ops_workers:device_barrier_world", world, heap_bytes=8 << 20,
                                  args=(cases,), timeout=900)
    for rank, res in enumerate(results):
        for what, err in res["errs"]:
            assert err < 2e-2, (rank, what, err)
        for what, (entered, exit_barrier, kernels, epoch) in res["entered"].items():
            inner = kernels - 1 if what == "bsp" else 0  # bsp: a barrier between its two kernels as well
            assert entered == cases["calls"] * (1 + inner + exit_barrier), (what, entered)
            assert epoch == cases["calls"], (what, epoch)  # the call count, kept on the device
        assert res["first"] < 2e-2
        if rank == world - 1:
            assert res["timeout"] is None  # it did not make the second call
        else:
            text, flag, counter, seconds = res["timeout"]
            n = res["late_entered"] + 1  # the entry barrier of the second call
            assert flag == "barrier" and counter == n, text
            assert f"{world - 1} of {world} ranks arrived" in text and f"device barrier {n} of ag_gemm" in text, text
            assert seconds < 60, seconds  # the wait timeout (5 s), not a hang


def test_out_variant_checks_its_outputs_in_the_fake_kernel():
    """op(..., out=) is tilec::<name>.out; the fake kernel checks the caller's outputs (no kernel runs: meta)."""
    ag = tilec.op(EX / "ag_gemm.tile", name="f_ag_out", world=2)
    c = _meta(8, 8)
    assert ag(_meta(4, 8), _meta(8, 8), out=c) is c
    assert set(torch.ops.tilec.f_ag_out.overloads()) == {"default", "out"}
    with pytest.raises(ArgumentError, match=re.escape("out 'C' has shape [8, 4], the program declares [8, 8]")):
        ag(_meta(4, 8), _meta(8, 8), out=_meta(8, 4))
    with pytest.raises(ArgumentError, match="out 'C' has dtype float32"):
        ag(_meta(4, 8), _meta(8, 8), out=_meta(8, 8, dtype=torch.float32))
    with pytest.raises(ArgumentError, match=re.escape("out= takes 1 tensor(s) (C)")):
        ag(_meta(4, 8), _meta(8, 8), out=(c, c))

    def f(a, b, c):
        ag(a, b, out=c)
        return c * 2

    g = torch.compile(f, backend="eager", fullgraph=True, dynamic=True)
    assert g(_meta(3, 8), _meta(8, 8), _meta(6, 8)).shape == (6, 8)


@pytest.mark.parametrize("dims, missing", [({}, "S"), ({"NS": 3, "L": 40}, "S"), ({"S": 100}, "NS"),
                                           ({"S": 100, "L": 40}, None), ({"S": 100, "NS": 3}, None)])
def test_a_dim_no_input_determines_must_be_given(dims, missing):
    """The split example's S (positions per rank) is in no input's shape, and NS, L only as a product (K: [B, HKV,
    NS*L, D]: fixing one determines the other): an op that does not fix them would silently take the .tile's example
    values. It is an error naming the dim; once fixed, the call binds the rest from the inputs."""
    name = f"f_fds_{'_'.join(dims) or 'none'}"
    if missing:
        with pytest.raises(ArgumentError, match=f"dim '{missing}' of flash_decode_splits \\(default \\d+, an example "
                                                "value\\): no input's shape determines it: give it in dims="):
            tilec.op(EX / "flash_decode_splits.tile", name=name, world=1, dims=dims)
        return
    op = tilec.op(EX / "flash_decode_splits.tile", name=name, world=1, dims=dims)
    q, k = torch.zeros(2, 8, 64), torch.zeros(2, 2, 120, 64)
    assert op.bind([q, k, k, torch.zeros(2, dtype=torch.int32)], 1) == {
        "B": 2, "HKV": 2, "G": 4, "D": 64, "S": 100, "NS": 3, "L": 40}
