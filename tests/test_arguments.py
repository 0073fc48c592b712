"""Runtime argument checks over a grid of argument forms (tests/_arg_workers.py): every broken form of every
argument, including tensors mutated in place after a good call (as_strided_, set_), raises an ArgumentError that
names the argument; valid calls around them, each with new inputs, give torch's result; heap.release() under a
program's internal buffers makes its next call allocate new ones instead of failing or corrupting them."""

from __future__ import annotations

import pytest
import torch

from tests._arg_workers import FORMS
from tests._util import compile_example, make_calls
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

DIMS = {"M": 64, "N": 32, "K": 32}

# what each form's error must say (besides the argument's name)
SAYS = {
    "dtype": "dtype float32 but the program declares f16",
    "shape": "but the program declares f16[",
    "transposed": "must be contiguous",
    "strided in place": "must be contiguous",
    "offset in place": "overlaps",
    "not a tensor": "expected a torch.Tensor, got list",
    "meta device": "on device meta",
    "overlaps output": "overlaps",
    "output overlaps": "overlaps",
    "in internal buffers": "internal buffers",
    "off heap": "declared symmetric",
}


def _torch_ag_gemm(inputs_per_rank, rank):
    """C of ag_gemm on `rank`: all ranks' A shards stacked, times B (f32)."""
    a = torch.cat([d["A"].float() for d in inputs_per_rank])
    return a @ inputs_per_rank[rank]["B"].float()


def _check_good(calls, results, rank=0):
    for inputs, out in results:
        per_rank = next(c for c in calls if torch.equal(c[rank]["A"], inputs["A"]))
        want = _torch_ag_gemm(per_rank, rank)
        err = float((out["C"].float() - want).abs().max()) / max(1.0, float(want.abs().max()))
        assert err < 2e-2, err


def test_every_broken_form_names_its_argument():
    prog = compile_example(1, "bsp", DIMS)
    calls = make_calls(prog, 5, seed=21)
    (res,) = spawn("tests._arg_workers:argument_grid", 1, args=(prog, calls), heap_bytes=1 << 22, timeout=300)
    errors = res["errors"]
    names = list(prog.signature())
    # every form exists for some argument, and every argument is broken in several forms
    assert {f for _n, f in errors} == set(FORMS) and set(SAYS) == set(FORMS)
    assert all(sum(n == name for n, _f in errors) >= 8 for name in names)
    for (name, form), text in errors.items():
        assert text is not None, f"{name} {form}: accepted"
        assert f"'{name}'" in text and SAYS[form] in text, (name, form, text)
    # a good call before the grid and after every broken one, each on new inputs: torch's result every time
    assert len(res["good"]) == len(errors) + 1
    _check_good(calls, res["good"])


def test_valid_changes_are_rechecked_and_right():
    """New placements that are valid (an ordinary tensor for a non-symmetric argument, tensors moved in place with
    set_ onto new heap memory, strides changed and back) run, with torch's result, each call with new inputs."""
    prog = compile_example(1, "flags", DIMS)
    calls = make_calls(prog, 4, seed=33)
    (res,) = spawn("tests._arg_workers:valid_forms", 1, args=(prog, calls), heap_bytes=1 << 22, timeout=300)
    assert len(res) == 4
    _check_good(calls, res)


@pytest.mark.parametrize("world, schedule", [(1, "bsp"), (2, "fused-push")])
def test_release_under_internal_buffers(world, schedule):
    """heap.release() below the buffers and flags a program allocated at its first call, then user data over them:
    the next call allocates new ones (flags from epoch 0 on every rank) and every call stays right (it used to
    raise IndexError reading a clobbered error word, or wait on clobbered flags)."""
    prog = compile_example(world, schedule, DIMS)
    calls = make_calls(prog, 3, seed=45)
    got = spawn("tests._arg_workers:release_and_reallocate", world, args=(prog, calls, 7.0), heap_bytes=1 << 22,
                timeout=300)
    for rank, res in enumerate(got):
        assert len(res) == 4
        _check_good(calls, res, rank)
