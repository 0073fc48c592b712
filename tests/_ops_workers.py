"""Rank functions of tests/test_ops.py (tilec ops inside torch code). One spawn runs them all: a spawn costs a
process start per rank, and every op compiles its variants once per process."""

from __future__ import annotations

import importlib.util
import sys

import torch
import torch.nn.functional as F

from tests._util import ROOT


def tp_block_module():
    """examples/tp_block.py (examples/ is not a package), registered in sys.modules: torch.compile looks its
    functions' module up by name."""
    if "tp_block" in sys.modules:
        return sys.modules["tp_block"]
    spec = importlib.util.spec_from_file_location("tp_block", ROOT / "examples" / "tp_block.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tp_block"] = mod
    spec.loader.exec_module(mod)
    return mod


def _shared(seed: int, *shape, dtype=torch.float16) -> torch.Tensor:
    """The same tensor on every rank."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max()) / max(1.0, float(want.float().abs().max()))


def ops_world(heap, cases: dict) -> dict:
    """Every case of test_ops.py on this rank; returns {case: result}. The torch references are computed here from
    the full (unsharded) inputs, which every rank can rebuild from the seeds."""
    import tilec

    rank, world = heap.rank, heap.world
    out = {}
    ag = tilec.op(ROOT / "examples" / "ag_gemm.tile", name="t_ag_gemm", dims={"BM": 32})
    rs = tilec.op(ROOT / "examples" / "gemm_rs.tile", name="t_gemm_rs", dims={"BM": 32})
    ar = tilec.op(ROOT / "examples" / "gemm_ar.tile", name="t_gemm_ar", dims={"BM": 32})

    # eager calls of three programs, against torch, at shapes the cases give (ragged tiles included)
    errs = []
    for m, n, k in cases["shapes"]:
        a, b = _shared(m * 7 + 1, m, k), _shared(n * 7 + 2, k, n)
        errs.append(("ag", m, _err(ag(a.chunk(world)[rank].contiguous(), b), a.float() @ b.float())))
        a_cols = a.chunk(world, dim=1)[rank].contiguous()
        b_rows = b.chunk(world, dim=0)[rank].contiguous()
        errs.append(("rs", m, _err(rs(a_cols, b_rows), (a.float() @ b.float()).chunk(world)[rank])))
        errs.append(("ar", m, _err(ar(a_cols, b_rows), a.float() @ b.float())))
    out["eager"] = errs

    # torch.compile(fullgraph=True) through two ops and torch code between them; a new M compiles a new variant
    def mlp(x, w1, w2):
        h = ag(x, w1)
        return rs(F.silu(h.float()).to(h.dtype), w2)

    f = torch.compile(mlp, backend="eager", fullgraph=True)
    k, n = 40, 24  # a shape the eager calls above did not compile
    w1, w2 = _shared(11, k, n * world), _shared(12, n * world, k)
    runs = []
    for m in cases["compile_m"]:
        before = (ag.stats["compiles"], rs.stats["compiles"])
        x = _shared(m, m, k)
        got = f(x.chunk(world)[rank].contiguous(), w1[:, rank * n:(rank + 1) * n].contiguous(),
                w2[rank * n:(rank + 1) * n].contiguous())
        want = (F.silu((x.float() @ w1.float()).half().float()).half().float() @ w2.float()).chunk(world)[rank]
        runs.append((m, _err(got, want), (ag.stats["compiles"] - before[0], rs.stats["compiles"] - before[1])))
    out["compile"] = runs

    # heap tensors are used in place, others are copied into the heap
    a, b = _shared(5, 64, 32), _shared(6, 32, 48)
    mine = a.chunk(world)[rank].contiguous()
    on_heap = tilec.empty(mine.shape, mine.dtype)
    on_heap.copy_(mine)
    copies = ag.stats["copies"]
    c_heap = ag(on_heap, b)
    heap_run = (ag.last_args["A"] == on_heap.data_ptr(), ag.stats["copies"] - copies)
    c_plain = ag(mine, b)
    plain_run = (ag.last_args["A"] == mine.data_ptr(), _on_heap(heap, ag.last_args["A"]),
                 ag.stats["copies"] - copies)
    out["placement"] = {"heap": heap_run, "plain": plain_run, "same": bool(torch.equal(c_heap, c_plain)),
                        "err": _err(c_heap, a.float() @ b.float())}

    out["out"] = _out_cases(ag, rank, world)

    # an op that does not fit in what is left of the heap: a clear error, on every rank alike
    big = tilec.op(ROOT / "examples" / "ag_gemm.tile", name="t_ag_gemm_big")
    m = 1 << 14  # its gathered buffer alone is 16 MiB, the whole heap of the test
    try:
        big(torch.zeros(m // world, 512, dtype=torch.float16), torch.zeros(512, 64, dtype=torch.float16))
        out["too_big"] = None
    except Exception as e:
        out["too_big"] = (type(e).__name__, str(e))

    # the TP block of examples/tp_block.py, compiled, against the unsharded model
    tp = tp_block_module()
    out["block"] = tp.run(heap, {**cases["block"], "compile": True})
    # again with device barriers (every op call's entry / exit barrier a device kernel, as inside a CUDA graph)
    out["block_dev"] = tp.run(heap, {**cases["block"], "compile": True, "barrier": "device", "retokens": []})
    return out


AG_SYM = """program ag_sym(world W)
  dims  M = 32, K = 16
  tiles BM = 16, BK = 16
  in  A : f32[M/W, K] symmetric
  out C : f32[M, K] symmetric
  stage gather over r in ranks, m in M/W by BM, k in K by BK:
    C[r*M/W + m, k] = A@r[m, k]
"""


def _out_cases(ag, rank: int, world: int) -> dict:
    """op(..., out=): where the program wrote (the caller's tensor or a staging one), copies, and the values."""
    import tilec

    res = {}
    a, b = _shared(7, 64, 32), _shared(8, 32, 48)
    mine, want = a.chunk(world)[rank].contiguous(), a.float() @ b.float()
    c = torch.empty(64, 48, dtype=torch.float16)
    copies = ag.stats["copies"]
    back = ag(mine, b, out=c)
    res["plain"] = (back is c, ag.last_args["C"] == c.data_ptr(), ag.stats["copies"] - copies - 1)  # A is copied
    res["plain_err"] = _err(c, want)
    ct = torch.empty(48, 64, dtype=torch.float16).t()
    copies = ag.stats["copies"]
    ag(mine, b, out=ct)
    res["strided"] = (ag.last_args["C"] == ct.data_ptr(), ag.stats["copies"] - copies - 1)
    res["strided_err"] = _err(ct, want)

    sym = tilec.op(source=AG_SYM, name="t_ag_sym")
    g = _shared(9, 32, 16, dtype=torch.float32)
    on_heap, plain = tilec.empty((32, 16), torch.float32), torch.empty(32, 16)
    x = g.chunk(world)[rank].contiguous()
    copies = sym.stats["copies"]
    sym(x, out=on_heap)
    res["sym_heap"] = (sym.last_args["C"] == on_heap.data_ptr(), sym.stats["copies"] - copies - 1)  # A is copied
    copies = sym.stats["copies"]
    sym(x, out=plain)
    res["sym_plain"] = (sym.last_args["C"] == plain.data_ptr(), sym.stats["copies"] - copies - 1)
    res["sym_err"] = max(float((on_heap - g).abs().max()), float((plain - g).abs().max()))

    def f(x, y, o):
        ag(x, y, out=o)
        return o.float() * 2

    comp = torch.compile(f, backend="eager", fullgraph=True)
    o = torch.empty(64, 48, dtype=torch.float16)
    res["compiled_err"] = max(_err(comp(mine, b, o), 2 * want), _err(o, want))
    return res


def _on_heap(heap, ptr: int) -> bool:
    base = heap.heap_bases()[heap.rank].item()
    return base <= ptr < base + heap.capacity


def sized_heap(heap, m: int, n: int, k: int) -> dict:
    """The heap is exactly what op.heap_bytes asked for (spawn rounds it up to whole pages): the op must fit."""
    import tilec

    ag = tilec.op(ROOT / "examples" / "ag_gemm.tile", name="t_ag_gemm_sized")
    a, b = _shared(1, m, k), _shared(2, k, n)
    c = ag(a.chunk(heap.world)[heap.rank].contiguous(), b)
    return {"err": _err(c, a.float() @ b.float()), "used": heap.used, "capacity": heap.capacity}


def device_barrier_world(heap, cases: dict) -> dict:
    """Ops whose barriers are device kernels (barrier="device", the form a CUDA graph holds) on the CPU emulation:
    many calls in a row against torch, a bsp schedule (barriers between its kernels too), and a rank that never
    makes a call (its peers' barrier times out)."""
    import time

    import tilec
    from tilec.program import WaitTimeout

    rank, world = heap.rank, heap.world
    tiles = {"BM": 16, "BN": 16, "BK": 16}
    ag = tilec.op(ROOT / "examples" / "ag_gemm.tile", name="t_ag_dev", dims=tiles, barrier="device")
    rs = tilec.op(ROOT / "examples" / "gemm_rs.tile", name="t_rs_dev", dims=tiles, barrier="device")
    bsp = tilec.op(ROOT / "examples" / "ag_gemm.tile", name="t_ag_dev_bsp", dims=tiles, barrier="device",
                   schedule="bsp")
    m, n, k = cases["shape"]
    errs = []
    for i in range(cases["calls"]):  # new inputs every call: a call that reads its peers' last inputs is caught
        a, b = _shared(100 + i, m, k), _shared(200 + i, k, n)
        mine = a.chunk(world)[rank].contiguous()
        errs.append(("ag", _err(ag(mine, b), a.float() @ b.float())))
        errs.append(("bsp", _err(bsp(mine, b), a.float() @ b.float())))
        a_cols, b_rows = a.chunk(world, dim=1)[rank].contiguous(), b.chunk(world, dim=0)[rank].contiguous()
        errs.append(("rs", _err(rs(a_cols, b_rows), (a.float() @ b.float()).chunk(world)[rank])))
    entered = {}
    for what, o in (("ag", ag), ("rs", rs), ("bsp", bsp)):
        (prog,) = o.variants.values()
        st = prog._state[id(heap)]
        entered[what] = (int(st["bufs"]["BARRIER"][1]), prog.module.EXIT_BARRIER, len(prog.module.KERNELS),
                         int(st["bufs"]["EPOCH"][0]))
    out = {"errs": errs, "entered": entered}

    # a call every rank makes, then one the last rank never makes: the others' entry barrier gives up after the
    # wait timeout
    late = tilec.op(ROOT / "examples" / "ag_gemm.tile", name="t_ag_dev_late", dims=tiles, barrier="device",
                    wait_timeout=cases["timeout"])
    a, b = _shared(1, m, k), _shared(2, k, n)
    mine = a.chunk(world)[rank].contiguous()
    out["first"] = _err(late(mine, b), a.float() @ b.float())
    (prog,) = late.variants.values()
    out["late_entered"] = int(prog._state[id(heap)]["bufs"]["BARRIER"][1])
    out["timeout"] = None
    if rank != world - 1:
        t0 = time.monotonic()
        try:
            late(mine, b)
        except WaitTimeout as e:
            out["timeout"] = (str(e), e.flag, e.counter, time.monotonic() - t0)
    return out


def captured_ops(heap, cases: dict) -> dict:
    """GPU: a TP MLP (tilec::ag_gemm -> SwiGLU -> tilec::gemm_rs, barrier="auto") recorded with torch.cuda.graph and
    with torch.compile(mode="reduce-overhead"); every replay on new inputs, and eager calls between replays, against
    torch. Then the calls a capture refuses: a bsp schedule, and a shape never called before."""
    import tilec
    from tilec.errors import ArgumentError

    rank, world = heap.rank, heap.world
    m, n, k = cases["shape"]  # tokens, per-rank hidden of the MLP, model width
    ag = tilec.op(ROOT / "examples" / "ag_gemm.tile", name="g_ag", retype={"f16": "bf16"})
    rs = tilec.op(ROOT / "examples" / "gemm_rs.tile", name="g_rs", retype={"f16": "bf16"})
    dev, bf = heap.device, torch.bfloat16
    w1, w2 = _shared(11, k, n * world, dtype=bf), _shared(12, n * world, k, dtype=bf)
    w1s, w2s = w1[:, rank * n:(rank + 1) * n].contiguous().to(dev), w2[rank * n:(rank + 1) * n].contiguous().to(dev)

    def mlp(x):
        h = ag(x, w1s)
        return rs(F.silu(h.float()).to(bf), w2s)

    def want(seed):
        x = _shared(seed, m, k, dtype=bf).float()
        return (F.silu((x @ w1.float()).to(bf).float()).to(bf).float() @ w2.float()).chunk(world)[rank]

    def mine(seed):
        return _shared(seed, m, k, dtype=bf).chunk(world)[rank].contiguous().to(dev)

    out = {"eager": _err(mlp(mine(1)).cpu(), want(1))}
    static_x = mine(1)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = mlp(static_x)
    errs = []
    for i in range(cases["replays"]):
        static_x.copy_(mine(20 + i))
        g.replay()
        errs.append(_err(static_y.cpu(), want(20 + i)))
        if i % 2:  # an eager call between replays: the device epoch goes on from where the replays left it
            errs.append(_err(mlp(mine(40 + i)).cpu(), want(40 + i)))
    out["graph"] = errs

    f = torch.compile(mlp, mode="reduce-overhead", fullgraph=True)
    out["compiled"] = [_err(f(mine(60 + i)).clone().cpu(), want(60 + i)) for i in range(cases["replays"])]

    refused = {}
    bsp = tilec.op(ROOT / "examples" / "ag_gemm.tile", name="g_ag_bsp", retype={"f16": "bf16"}, schedule="bsp")
    bsp(mine(1), w1s)
    for what, call in (("bsp", lambda: bsp(static_x, w1s)), ("new shape", lambda: ag(static_x[:m // world // 2],
                                                                                         w1s))):
        torch.cuda.synchronize()
        try:
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                call()
            refused[what] = None
        except ArgumentError as e:
            refused[what] = str(e)
    out["refused"] = refused
    return out


def late_peer_gpu(heap, cases: dict) -> dict:
    """GPU: op calls return once their kernels are queued. A call the last rank never makes times out on the others
    (their entry barrier, a device kernel with barrier="device", gives up after the wait timeout); that must not be
    lost: the op's next call raises WaitTimeout before it launches, and check_errors() raises it at once."""
    import time

    import tilec
    from tilec.program import WaitTimeout

    rank, world = heap.rank, heap.world
    tiles = {"BM": 16, "BN": 16, "BK": 16}
    m, n, k = cases["shape"]
    a, b = _shared(1, m, k), _shared(2, k, n)
    mine, b = a.chunk(world)[rank].contiguous().to(heap.device), b.to(heap.device)
    out = {}
    for how in ("next call", "check_errors"):
        late = tilec.op(ROOT / "examples" / "ag_gemm.tile", name=f"g_late_{how.replace(' ', '_')}", dims=tiles,
                        barrier="device", wait_timeout=cases["timeout"])
        out[how] = {"first": _err(late(mine, b).cpu(), a.float() @ b.float().cpu()), "raised": None}
        heap.barrier()
        if rank != world - 1:
            t0 = time.monotonic()
            late(mine, b)  # its peer never comes: returns at once, its barrier kernel times out on the GPU
            out[how]["returned_s"] = time.monotonic() - t0
            try:
                if how == "next call":
                    time.sleep(cases["timeout"] + 2)  # the GPU has given up by now
                    late(mine, b)
                else:
                    late.check_errors()
            except WaitTimeout as e:
                out[how]["raised"] = (str(e), e.flag, time.monotonic() - t0)
        heap.barrier()
    return out
