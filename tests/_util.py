"""Helpers of the compiler tests (parent side): compiling the example and test programs, inputs, torch checks."""

from __future__ import annotations

from pathlib import Path

import torch

import tilec
from tilec.passes.schedules import SCHEDULES  # noqa: F401 - every schedule tilec has
from tilec.reference import TORCH_DTYPE

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ag_gemm.tile"
PROGRAMS = Path(__file__).resolve().parent / "programs"
TOL = {"f16": 2e-2, "bf16": 6e-2, "f32": 1e-4}


def retyped(source: str, dtype: str) -> str:
    """The program text with every f16 declaration turned into `dtype` (compiled from `source=` text)."""
    return source if dtype == "f16" else source.replace("f16[", f"{dtype}[")


def compile_example(world: int, schedule: str, dims: dict | None = None, dtype: str = "f16", **kw):
    """examples/ag_gemm.tile; the file name in diagnostics and headers is the repository-relative path."""
    src = retyped(EXAMPLE.read_text(), dtype)
    return tilec.compile("examples/ag_gemm.tile", world=world, schedule=schedule, dims=dims, source=src, **kw)


def program_source(name: str) -> str:
    return (PROGRAMS / f"{name}.tile").read_text()


def compile_program(name: str, world: int, schedule: str, dims: dict | None = None, dtype: str = "f16", **kw):
    """tests/programs/NAME.tile."""
    src = retyped(program_source(name), dtype)
    return tilec.compile(f"tests/programs/{name}.tile", world=world, schedule=schedule, dims=dims, source=src, **kw)


def make_calls(prog, calls: int, seed: int, positive: tuple[str, ...] = ()) -> list[list[dict[str, torch.Tensor]]]:
    """Inputs of every call: calls[i][rank] = {input name: tensor}, different in every call and on every rank.
    Names in `positive` get values in [0.5, 1.5) (for log/sqrt)."""
    out = []
    for c in range(calls):
        per_rank = []
        for r in range(prog.world):
            d = {}
            for i, (name, (kind, dtype, shape, _sym)) in enumerate(prog.signature().items()):
                if kind != "in":
                    continue
                g = torch.Generator().manual_seed(seed * 100_003 + c * 1009 + r * 101 + i)
                x = torch.rand(shape, generator=g) + 0.5 if name in positive else torch.randn(shape, generator=g)
                d[name] = x.to(TORCH_DTYPE[dtype])
            per_rank.append(d)
        out.append(per_rank)
    return out


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max(1, max |want|); inf when got has NaNs (outputs are poisoned before every call)."""
    got, want = got.float(), want.float()
    assert got.shape == want.shape, (tuple(got.shape), tuple(want.shape))
    if torch.isnan(got).any():
        return float("inf")
    if got.numel() == 0:
        return 0.0
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def check_close(got: torch.Tensor, want: torch.Tensor, dtype: str, what: str) -> None:
    err = rel_err(got, want)
    assert err <= TOL[dtype], f"{what}: relative error {err:.3g} > {TOL[dtype]:g}"


def cat_shards(calls_i: list[dict[str, torch.Tensor]], name: str, dim: int = 0) -> torch.Tensor:
    """Every rank's `name` of one call, concatenated along `dim`, in f32."""
    return torch.cat([d[name].float() for d in calls_i], dim=dim)
