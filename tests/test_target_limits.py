"""Known limits of the target, checked when a program is compiled (not when Triton builds its kernel): a tile of
more elements than Triton's block limit, and a pipelined reduction whose tiles need more shared memory than any
target gives one program, are located errors (file:line:col, caret, the tile and the limit named; exit 2)."""

from __future__ import annotations

import random

import pytest

import tilec
from tests._util import ROOT
from tilec.errors import CompileError
from tilec.frontend import limits

ELEMWISE = """program big(world W)
  dims  {DIMS}
  tiles {TILES}
  in  X : f32[{SHAPE}]
  out Y : f32[{SHAPE}]
  stage s over {LOOPS}:
    Y[{IDX}] = X[{IDX}] * 2
"""


def _elementwise(steps: list[int]) -> str:
    names = "MNP"[:len(steps)]
    return ELEMWISE.format(DIMS=", ".join(f"{n} = {s}" for n, s in zip(names, steps, strict=True)),
                           TILES=", ".join(f"B{n} = {s}" for n, s in zip(names, steps, strict=True)),
                           SHAPE=", ".join(names), IDX=", ".join(n.lower() for n in names),
                           LOOPS=", ".join(f"{n.lower()} in {n} by B{n}" for n in names))


def test_the_element_limit_is_tritons():
    import triton.language as tl

    assert limits.TRITON_MAX_NUMEL == tl.TRITON_MAX_TENSOR_NUMEL


def test_tiles_past_the_element_limit_are_located_errors():
    """Tiles of 1-3 dims around 2**20 elements: rejected exactly when they have more, at the statement, naming the
    tile and the limit; smaller ones compile."""
    rnd = random.Random(5)
    seen = {True: 0, False: 0}
    for _ in range(12):
        nd = rnd.choice([1, 2, 3])
        total = rnd.choice([19, 20, 20, 21, 22])  # log2 of the tile's elements
        cuts = sorted(rnd.randint(0, total) for _ in range(nd - 1))
        steps = [2 ** (b - a) for a, b in zip([0, *cuts], [*cuts, total], strict=True)]
        src = _elementwise(steps)
        over = total > 20
        try:
            tilec.compile("big.tile", world=1, schedule="bsp", source=src)
        except CompileError as e:
            assert over, f"false rejection of {steps}: {e}"
            (d,) = e.diagnostics
            assert (d.loc.file, d.loc.line) == ("big.tile", 7) and d.loc.col >= 5
            n = 2 ** total
            assert f"has {' x '.join(map(str, steps))} = {n} elements, more than Triton's limit of 2**20" in d.message
            assert "^" in e.render()
            seen[True] += 1
            continue
        assert not over, f"{steps} ({2 ** total} elements) compiled"
        seen[False] += 1
    assert seen[True] >= 3 and seen[False] >= 3, seen


def test_the_cli_exits_2_for_a_tile_past_the_limit(tmp_path, capsys):
    from tilec.cli.commands import main

    p = tmp_path / "big.tile"
    p.write_text(_elementwise([65536, 32]))
    for cmd in ("check", "compile"):
        rc = main([cmd, str(p)])
        err = capsys.readouterr().err
        assert rc == 2, (cmd, err)
        assert f"{p}:7:5: error: the tile Y[m, n] has 65536 x 32 = 2097152 elements" in err, err


GEMM = """program gemm(world W)
  dims  M = {BM}, N = {BN}, K = {K}
  tiles BM = {BM}, BN = {BN}, BK = {BK}
  in  A : {T}[M, K]
  in  B : {T}[K, N]
  out C : {T}[M, N]
  stage gemm over m in M by BM, n in N by BN:
    C[m, n] = sum k in K by BK: A[m, k] @ B[k, n]
"""


@pytest.mark.parametrize("bm,bn,bk,dtype,stages", [(256, 256, 256, "f16", 3), (128, 256, 128, "f32", 4),
                                                    (256, 256, 128, "f16", 4)])
def test_pipelined_tiles_past_any_targets_shared_memory_are_located_errors(bm, bn, bk, dtype, stages):
    src = GEMM.format(BM=bm, BN=bn, BK=bk, K=4 * bk, T=dtype)
    need = (stages - 1) * (bm * bk + bk * bn) * (2 if dtype == "f16" else 4)
    assert need > max(limits.SHARED_PER_PROGRAM.values())
    with pytest.raises(CompileError) as e:
        tilec.compile("gemm.tile", world=1, schedule="bsp", source=src, num_stages=stages)
    (d,) = e.value.diagnostics
    assert (d.loc.line, d.loc.col) == (8, 15)
    assert f"at least {need} bytes of shared memory, more than any known target gives one program" in d.message
    # one stage fewer in flight fits: the same tiles compile
    tilec.compile("gemm.tile", world=1, schedule="bsp", source=src, num_stages=1)


@pytest.mark.parametrize("bm,bn,bk,stages", [(128, 128, 64, 3), (64, 256, 64, 4)])
def test_the_shared_memory_bound_is_below_what_triton_allocates(bm, bn, bk, stages):
    """The bound is a lower bound (no false rejection): Triton's own sm_90 build of an accepted GEMM allocates
    at least that much."""
    from tilec.codegen.target_check import compile_for_target

    src = GEMM.format(BM=bm, BN=bn, BK=bk, K=4 * bk, T="f16")
    prog = tilec.compile("gemm.tile", world=1, schedule="bsp", source=src, num_stages=stages)
    (built,) = compile_for_target(prog, "cuda:90")
    assert (stages - 1) * (bm * bk + bk * bn) * 2 <= built.shared, built


def test_streamed_attend_keys_may_exceed_the_block_limit():
    """attend streams its keys in blocks of attend_block: a key tile past 2**20 elements is not one block."""
    src = (ROOT / "examples" / "flash_decode.tile").read_text()
    prog = tilec.compile("examples/flash_decode.tile", world=1, schedule="bsp", source=src,
                         dims={"B": 1, "HKV": 1, "G": 4, "D": 128, "S": 16384, "BS": 16384})
    assert prog.source
