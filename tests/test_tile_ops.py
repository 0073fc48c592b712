"""Operations inside one tile (docs/tile_operations.md): numpy broadcasting, `@` over tiles with leading dims of size
1, `sum/max/min(x, dim=d)`, `x.T`, the casts (`i32(x)` among them) and `lse_merge(o, lse, dim=d)`: the shapes sema
gives them, the generated kernels run on one CPU rank against torch (ragged tiles, so padding lanes must not count),
and a located error for each misuse."""

from __future__ import annotations

import pytest
import torch

import tilec
from tests import _workers
from tests._util import check_close, make_calls
from tilec.errors import CompileError
from tilec.frontend.parser import parse
from tilec.frontend.sema import check
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

# 40 rows in 16-row tiles and 24 columns in one 32-wide `:` tile: the last row tile and every column tile are padded
ROWS = """program rows(world W)
  dims  M = 40, N = 24
  tiles BM = 16

  in  X  : f32[M, N]
  in  v  : f32[N]
  out S  : f32[M]
  out Mx : f32[M]
  out Mn : f32[M]
  out Cs : f32[N]
  out Y  : f32[M, N]
  out T  : f32[N, M]
  out I  : i32[M, N]
  out H  : f16[M, N]
  out V  : f32[M, N]
  out F  : f32[M, N]

  stage rows over m in M by BM:
    S[m] = sum(X[m, :], dim=1)
    Mx[m] = max(exp(X[m, :]) - 100, dim=1)
    Mn[m] = min(abs(X[m, :]) + 1, dim=-1)
    Y[m, :] = X[m, :] + v[:] - max(X[m, :], dim=1, keepdim=1)
    T[:, m] = X[m, :].T
    I[m, :] = i32(X[m, :] * 4)
    H[m, :] = f16(X[m, :])
    V[m, :] = v[:]
    F[m, :] = sqrt(abs(i32(X[m, :] * 4)))
  stage cols over n in N by 8:
    Cs[n] = sum(X[:, n], dim=0)
"""


def rows_want(x, v):
    return {"S": x.sum(1), "Mx": (torch.exp(x) - 100).amax(1), "Mn": (x.abs() + 1).amin(1),
            "Y": x + v - x.amax(1, keepdim=True), "T": x.T, "I": (x * 4).to(torch.int32), "H": x.half(),
            "V": v.expand_as(x), "Cs": x.sum(0), "F": (x * 4).to(torch.int32).abs().float().sqrt()}


# `@` of a [1, BM, BK] tile (b one element) and of a transposed tile; lse_merge over the partials' dim 1
MATS = """program mats(world W)
  dims  B = 2, M = 24, K = 16, N = 20, S = 4, D = 16
  tiles BM = 16, BN = 32, BK = 16

  in  X  : f32[B, M, K]
  in  Y  : f32[K, N]
  in  P  : f32[M, N]
  in  O  : f32[M, S, D]
  in  L  : f32[M, S]
  out C  : f32[B, M, N]
  out Z  : f32[K, N]
  out Om : f32[M, D]
  out Lm : f32[M]

  stage mm over b in B by 1, m in M by BM, n in N by BN:
    C[b, m, n] = sum k in K by BK: X[b, m, k] @ Y[k, n]
  stage tt over n in N by BN:
    Z[:, n] = sum m in M by BM: X[1, m, :].T @ P[m, n]
  stage merge over m in M by BM:
    Om[m, :], Lm[m] = lse_merge(O[m, :, :], L[m, :], dim=1)
"""


def mats_want(ins):
    x, y, p, o, lse = (ins[n].float() for n in ("X", "Y", "P", "O", "L"))
    big = torch.logsumexp(lse, dim=1)
    return {"C": x @ y, "Z": x[1].T @ p, "Om": (torch.exp(lse - big[:, None])[..., None] * o).sum(1), "Lm": big}


def _shapes(src: str) -> dict[str, tuple]:
    prog = check(parse(src, "t.tile"), 1)
    return {st.access.tensor: st.value.shape for it in prog.items if hasattr(it, "body") for st in it.body}


def test_shapes():
    s = _shapes(ROWS)
    assert s["S"] == (16,) and s["Mx"] == (16,) and s["Mn"] == (16,) and s["Cs"] == (8,)
    assert s["Y"] == (16, 32)  # [16, 32] + [32] - [16, 1]: numpy's rule
    assert s["T"] == (32, 16) and s["I"] == (16, 32) and s["V"] == (32,)
    m = check(parse(MATS, "t.tile"), 1)
    mm = next(it for it in m.items if getattr(it, "name", "") == "mm").body[0].value
    assert mm.body.lhs.shape == (1, 16, 16) and mm.shape == (16, 32)  # the [1, BM, BK] tile taken as [BM, BK]


def test_dtypes():
    prog = check(parse(ROWS, "t.tile"), 1)
    body = {st.access.tensor: st.value for it in prog.items if hasattr(it, "body") for st in it.body}
    assert body["I"].dtype == "i32" and body["H"].dtype == "f16" and body["S"].dtype == "f32"
    assert body["T"].dtype == "f32"  # a transpose keeps its tile's dtype (an f16 tile stays f16 for `@`)


def test_programs_match_torch():
    progs = {name: tilec.compile(f"{name}.tile", world=1, schedule="bsp", source=src)
             for name, src in (("rows", ROWS), ("mats", MATS))}
    calls = {name: make_calls(p, 2, seed=31 + i) for i, (name, p) in enumerate(progs.items())}
    batch = [(name, p, calls[name], ()) for name, p in progs.items()]
    (got,) = spawn(_workers.run_cases, 1, heap_bytes=1 << 24, timeout=300, args=(batch,))
    for i, per_rank in enumerate(calls["rows"]):
        ins = per_rank[0]
        want = rows_want(ins["X"].float(), ins["v"].float())
        for name, w in want.items():
            g = got["rows"][i][name]
            assert g.dtype == w.dtype, name
            check_close(g.float(), w.float(), "f16" if name == "H" else "f32", f"rows call {i + 1} {name}")
    for i, per_rank in enumerate(calls["mats"]):
        for name, w in mats_want(per_rank[0]).items():
            check_close(got["mats"][i][name], w, "f32", f"mats call {i + 1} {name}")
    # every value is below 0 (and above for Mn's -X): a padding lane of 0 would win the max
    assert float(got["rows"][0]["Mx"].max()) < 0


def test_kernels_reduce_and_transpose_inside_the_tile():
    src = tilec.compile("rows.tile", world=1, schedule="bsp", source=ROWS).source
    assert "tl.sum(" in src and "axis=1" in src and "tl.trans(" in src and "keep_dims=True" in src
    assert 'float("-inf")' in src  # max over a padded tile: the padding is -inf, not the loads' 0
    assert "[None, :]" in src  # the [N] row broadcast over the [BM, N] tile as numpy aligns it


BAD = {
    "sum_dim": ("S[m] = sum(X[m, :], dim=2)", "sum(..., dim=2): a 2-d tile [16, 32] has no dim 2 (dims are 0..1)"),
    "max_no_dim": ("S[m] = max(X[m, :])", "max(x, dim=d) reduces one tile along dim d; max(a, b) is the element-wise"),
    "kwarg": ("S[m] = sum(X[m, :], axis=1)", "sum() has no argument 'axis' (it takes dim, keepdim)"),
    "kwarg_other": ("Y[m, :] = exp(X[m, :], dim=1)", "exp() has no argument 'dim'"),
    "matmul_inner": ("Y[m, :] = X[m, :] @ X[m, :]", "shape mismatch in '@': [16, 32] @ [16, 32] (inner dims 32 and 16"
                                                    " differ)"),
    "matmul_rank": ("S[m] = v[:] @ X[m, :]", "'@' needs 2-d tiles, got [32] @ [16, 32]"),
    "transpose_1d": ("Y[m, :] = v[:].T", "'.T' transposes a 2-d tile, got a 1-d tile [32]"),
    "transpose_number": ("S[m] = 1.T", "'.T' transposes a 2-d tile, got a 0-d tile []"),  # `1.` is not a float here
    "attribute": ("Y[m, :] = X[m, :].U", "a tile has no attribute 'U' (tiles have `.T`, the transpose)"),
    "lse_dim": ("Y[m, :], S[m] = lse_merge(X[m, :], L[m], dim=3)",
                "lse_merge(..., dim=3): a 1-d tile [16] has no dim 3 (dims are 0..0)"),
}

BAD_SRC = """program bad(world W)
  dims  M = 40, N = 24
  tiles BM = 16

  in  X  : f32[M, N]
  in  v  : f32[N]
  in  L  : f32[M]
  out S  : f32[M]
  out Y  : f32[M, N]

  stage rows over m in M by BM:
    {stmt}
"""


@pytest.mark.parametrize("case", list(BAD))
def test_misuse_is_a_located_error(case):
    stmt, phrase = BAD[case]
    with pytest.raises(CompileError) as info:
        tilec.compile("bad.tile", world=1, schedule="bsp", source=BAD_SRC.format(stmt=stmt))
    text = info.value.render() if hasattr(info.value, "render") else str(info.value)
    assert phrase in text, text
    assert text.startswith("bad.tile:12:") and "^" in text, text


def test_incompatible_broadcast_is_a_located_error():
    src = BAD_SRC.format(stmt="Y[m, :] = X[m, :] + L[m]")
    with pytest.raises(CompileError) as info:
        tilec.compile("bad.tile", world=1, schedule="bsp", source=src)
    text = info.value.render() if hasattr(info.value, "render") else str(info.value)
    assert "bad.tile:12:15: error: shape mismatch in '+': [16, 32] and [16]" in text, text
