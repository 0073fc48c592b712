"""The GPU launch path of generated modules, without a GPU: warmup compiles each kernel for the program count it
will launch with (NPROG is a compile-time constant), sizes persistent grids by occupancy, and calls go straight
to the compiled handle with that same count.

Triton's JIT and the device properties are replaced by fakes that record what was compiled and launched; the
generated module and LaunchContext are the real ones."""

import contextlib
import threading
from types import SimpleNamespace

import pytest
import torch

import tilec
from tilec.runtime import launch
from tilec.runtime.launch import LaunchContext


class FakeCompiled:
    def __init__(self, nprog, regs, shared):
        self.nprog, self.n_regs, self.metadata, self.launches = nprog, regs, SimpleNamespace(shared=shared), []

    def _init_handles(self):
        pass

    def __getitem__(self, grid):
        return lambda *args: self.launches.append((grid, args))


class FakeKernel:
    """Stands in for a @triton.jit kernel: .warmup compiles (records NPROG), [grid](...) is the JIT launch path.
    Under Triton's async compile mode it does what JITFunction does: the compile goes to the mode's executor, the
    finish (module load, post-compile hooks) runs where the future's result() is asked for."""

    def __init__(self, name, regs, shared, fails=False):
        self.__name__, self.regs, self.shared, self.compiles, self.jit_launches = name, regs, shared, [], []
        self.pdl, self.claim, self.built_on, self.finished_on, self.fails = [], [], [], [], fails

    def warmup(self, *args, INTERPRET, GRAPH, PDL, CLAIM, grid, num_warps, num_stages, launch_pdl):  # noqa: N803
        from triton.runtime._async_compile import active_mode

        assert PDL == launch_pdl  # a kernel that may start early must wait for its predecessor on the device
        self.pdl.append(PDL)
        self.claim.append(CLAIM)
        self.compiles.append(args[-1])  # NPROG: the last positional argument

        def build():
            self.built_on.append(threading.current_thread().name)
            if self.fails:
                raise RuntimeError(f"{self.__name__} does not compile")
            return FakeCompiled(args[-1], self.regs, self.shared)

        mode = active_mode.get()
        if mode is None:
            return build()
        return mode.submit((self.__name__, args[-1], PDL, CLAIM), build,
                           lambda kernel: self.finished_on.append(threading.current_thread().name))

    def __getitem__(self, grid):
        return lambda *args, **kw: self.jit_launches.append(grid)


class FakeHeap:
    rank, interpret, device = 0, False, "cuda:0"

    def heap_bases(self):
        return torch.zeros(1, dtype=torch.int64)

    def barrier(self):
        pass


def _setup(monkeypatch, regs, shared, schedule="fused-push", major=None, example="examples/flash_decode.tile",
           dims=None, world=1, fails=None, pdl=None):
    props = SimpleNamespace(multi_processor_count=132, regs_per_multiprocessor=65536,
                            shared_memory_per_multiprocessor=228 * 1024, max_threads_per_multi_processor=2048)
    if major is not None:
        props.major = major
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: props)
    dims = dims or dict(B=2, HKV=16, G=8, D=128, S=8192, BS=256)
    prog = tilec.compile(example, world=world, schedule=schedule, dims=dims)
    mod = prog.module
    fakes = [FakeKernel(k.__name__, regs, shared, fails=k.__name__ == fails) for k, *_ in mod.KERNELS]
    monkeypatch.setattr(mod, "KERNELS", [(f, *rest) for f, (_k, *rest) in zip(fakes, mod.KERNELS, strict=True)])
    ctx = LaunchContext(FakeHeap(), timeout_ns=10, pdl=pdl)
    bufs = {n: torch.zeros(1) for n in list(mod.TENSORS) + list(mod.FLAGS) + ["ERR", "EPOCH"]}
    return mod, fakes, ctx, bufs


# 4 warps: 255 registers a thread still fit twice in 64K; 150 KiB of shared memory only once
@pytest.mark.parametrize(("regs", "shared", "per_sm"), [(96, 40 * 1024, 2), (255, 40 * 1024, 2), (64, 150 * 1024, 1)])
def test_persistent_grid_follows_occupancy(monkeypatch, regs, shared, per_sm):
    mod, (k,), ctx, bufs = _setup(monkeypatch, regs, shared)
    total = mod.KERNELS[0][1]
    launch.warmup(ctx, mod, bufs)
    want = min(total, 132 * per_sm)
    assert k.compiles[-1] == want  # compiled for the count it launches with
    assert len(k.compiles) == (1 if per_sm == 1 else 2)  # recompiled only when more programs fit
    launch.launch(ctx, mod, bufs, epoch=1)
    plan = ctx.plan
    launch.launch(ctx, mod, bufs, epoch=2)
    assert ctx.plan is plan  # the same tensors: the second call reuses the launch plan
    args = launch.kernel_args(ctx, bufs, 1, mod.KERNELS[0], want)
    compiled = ctx.compiled[(k, want, launch.aligned(args), False)]
    assert [g for g, _ in compiled.launches] == [(want, 1, 1)] * 2  # straight to the compiled kernel
    # (.., epoch, timeout_ns, EPOCH_AT, NPROG, INTERPRET, GRAPH, PDL, CLAIM); tensors go to Triton's launcher as
    # their addresses; PDL off: the fake device reports no compute capability; no claims off MPS
    assert [(a[-8], a[-7], a[-5], a[-3], a[-2], a[-1]) for _, a in compiled.launches] == [
        (1, 10, want, False, False, False), (2, 10, want, False, False, False)]
    assert compiled.launches[0][1][-6] == bufs["EPOCH"].data_ptr() and not k.jit_launches
    assert all(isinstance(x, int) for _, a in compiled.launches for x in a)
    assert compiled.launches[0][1][0] == args[0].data_ptr()


def test_one_program_kernels_are_not_resized(monkeypatch):
    mod, fakes, ctx, bufs = _setup(monkeypatch, 64, 16 * 1024, schedule="bsp")
    launch.warmup(ctx, mod, bufs)
    for f, (_k, total, persistent, *_r) in zip(fakes, mod.KERNELS, strict=True):
        assert not persistent and f.compiles == [total]  # one program per task, compiled once


def test_kernels_of_a_program_compile_side_by_side(monkeypatch):
    """Each kernel's compile runs in a thread of its own (NVSHMEM's device library makes one take seconds); the
    finish, which loads the module and runs NVSHMEM's module init, stays on the calling thread."""
    mod, fakes, ctx, bufs = _setup(monkeypatch, 64, 16 * 1024, schedule="flags", example="examples/ag_gemm.tile",
                                   dims={"M": 256, "N": 256, "K": 128}, world=2)
    assert len(fakes) >= 2
    launch.warmup(ctx, mod, bufs)
    for f, (_k, total, persistent, *_r) in zip(fakes, mod.KERNELS, strict=True):
        assert f.built_on and all(t.startswith("tilec-compile") for t in f.built_on), f.built_on
        assert f.finished_on and set(f.finished_on) == {threading.main_thread().name}
        nprog = f.compiles[-1]
        args = launch.kernel_args(ctx, bufs, 1, (f, total, persistent, *_r), nprog)
        assert ctx.compiled[(f, nprog, launch.aligned(args), False)].nprog == nprog  # each under its own key


def test_a_kernel_that_does_not_compile_is_the_error(monkeypatch):
    mod, fakes, ctx, bufs = _setup(monkeypatch, 64, 16 * 1024, schedule="flags", example="examples/ag_gemm.tile",
                                   dims={"M": 256, "N": 256, "K": 128}, world=2, fails="k1_gemm")
    assert "k1_gemm" in [f.__name__ for f in fakes]
    with pytest.raises(RuntimeError, match="k1_gemm does not compile"):
        launch.warmup(ctx, mod, bufs)


@pytest.mark.parametrize(("example", "schedule", "major", "option", "pdl"), [
    ("examples/flash_decode.tile", "bsp", 9, None, True),  # kernels one after another on sm_90: every one
    ("examples/flash_decode.tile", "fused-push", 9, None, True),
    ("examples/flash_decode.tile", "bsp", 8, None, False),  # no griddepcontrol before sm_90
    ("examples/flash_decode.tile", "bsp", 9, False, False),  # pdl=False
    ("examples/ag_gemm.tile", "flags", 9, None, False),  # a concurrent pair: never launched early
])
def test_programmatic_dependent_launch(monkeypatch, example, schedule, major, option, pdl):
    dims = dict(M=64, N=64, K=64, BM=32, BN=32, BK=32) if "ag_gemm" in example else None
    # world 2 for flags: at world 1 local-in-place leaves ag_gemm's gemm alone (no concurrent pair)
    mod, fakes, ctx, bufs = _setup(monkeypatch, 64, 16 * 1024, schedule=schedule, major=major, example=example,
                                   dims=dims, world=2 if schedule == "flags" else 1, pdl=option)
    launch.warmup(ctx, mod, bufs)
    assert all(f.pdl and set(f.pdl) == {pdl} for f in fakes)
    monkeypatch.setattr(ctx, "stream", lambda i: contextlib.nullcontext())  # no CUDA streams here
    monkeypatch.setattr(ctx, "join_streams", lambda: None)
    launch.launch(ctx, mod, bufs, epoch=1)
    for entry, (_stream, _barrier, _runner, k, nprog, _args, _claim) in zip(mod.KERNELS, ctx.plan, strict=True):
        args = launch.kernel_args(ctx, bufs, 1, entry, nprog)  # PDL: the launch's last argument but one (CLAIM)
        launches = ctx.compiled[(k, nprog, launch.aligned(args), False)].launches
        assert launches[-1][1][-2] == pdl


@pytest.mark.parametrize(("schedule", "dims", "claims"), [
    ("fused-push", dict(M=1024, N=1024, K=64, BM=32, BN=32, BK=32), [True]),  # 1024+ tasks on 132 programs
    ("bsp", dict(M=1024, N=1024, K=64, BM=32, BN=32, BK=32), [False, False]),  # a program per task: the hardware
    # hands out the programs as SMs free up, which is a claim already
    ("fused-push", dict(M=64, N=64, K=64, BM=32, BN=32, BK=32), [False]),  # every task a program of its own
])
def test_persistent_loops_claim_their_tasks_where_asked(monkeypatch, schedule, dims, claims):
    """LaunchContext.claim (under MPS): a persistent kernel with more tasks than programs is compiled and launched
    with CLAIM (tilec.device.first_task); one-program-per-task kernels and grids that hold every task keep the
    stride (a fold's sharing arrivals count on every task having a program)."""
    mod, fakes, ctx, bufs = _setup(monkeypatch, 255, 150 * 1024, schedule=schedule, example="examples/ag_gemm.tile",
                                   dims=dims, world=2)
    ctx.claim = True
    launch.warmup(ctx, mod, bufs)
    assert [f.claim[-1] for f in fakes] == claims
    monkeypatch.setattr(ctx, "stream", lambda i: contextlib.nullcontext())
    monkeypatch.setattr(ctx, "join_streams", lambda: None)
    launch.launch(ctx, mod, bufs, epoch=1)
    assert [p[-1] for p in ctx.plan] == claims  # launched as compiled
