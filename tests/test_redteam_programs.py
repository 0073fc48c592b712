"""Valid programs in shapes the examples never take (an outside tester's), checked against torch models of their own.

Families, each generated from a table (not one program):
- `%` in tile math: a located CompileError (it reached codegen as a KeyError); `%` of two constants folds.
- stores of constants: literals, casts of literals, constant arithmetic, into f32 / f16 / bf16 / i32 outputs
  (`tl.broadcast_to(3.5, ...)` and `1.5.to(...)` did not compile, on the interpreter or for a GPU).
- a bad value of a dim or tile (`-D M=0`, a tile 3 or 2**41) is one error, not also every shape and index that
  was then checked with a placeholder 1 in its place (`M/W` not an integer, out-of-bounds indexes).
- one element of a 1-d tensor (`v[3]`, `lens[0]`: a [1] tile) in element-wise math with a 2-d tile: it said
  "shape mismatch in '*': [8, 8] and [1]", while `s[2, 3]` of a 2-d tensor worked.
- a tile stored with its unit dims elsewhere (`Z[r, m] = Y@r[m, 0]`: a [BM, 1] value into a [1, BM] tile): the
  reference interpreter crashed broadcasting it, and an element-wise value of that kind did not compile (the
  store broadcast it instead of reshaping it).
- a stage whose every target is `_` stores nothing: a located error (fuse-comm crashed with an IndexError on it).
- outputs a program writes only in part: `tilec run` compared the elements left alone (poisoned before the call)
  with the reference's zeros and reported a wrong result.
- sums over a ragged tile loop (the loop's extent not a multiple of its step) of a body that is not zero where the
  last tile is masked (`exp(x)`, `x + 1`, a GEMM of computed operands): the kernel added the masked lanes (exp(0) = 1)
  and the reference interpreter crashed adding the clipped last tile to the whole ones.
Every program runs for real (CPU emulation, one spawn per world) and is also checked through the reference
interpreter, against torch.
"""

from __future__ import annotations

import pytest
import torch

import tilec
from tests import _workers
from tests._util import ROOT, make_calls, rel_err
from tilec.cli import main as cli_main
from tilec.errors import CompileError
from tilec.frontend.parser import parse
from tilec.reference import evaluate
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

# -- `%` in tile math ---------------------------------------------------------------------------------------------

REMAINDERS = ["X[m] % 2", "2 % X[m]", "exp(X[m] % 3)", "X[m] * (X[m] % 1.5)", "max(X[m], 1) % M", "rank % X[m]",
              "X[m] + m % 4", "sum r in ranks: X@r[m] % 2"]


def _one_stage(expr: str, out_dtype: str = "f32") -> str:
    return (f"program p(world W)\n  dims M = 10\n  tiles BM = 4\n  in X : f32[M] symmetric\n"
            f"  out C : {out_dtype}[M]\n  stage s over m in M by BM:\n    C[m] = {expr}\n")


@pytest.mark.parametrize("expr", REMAINDERS)
def test_remainder_in_tile_math_is_a_located_error(tmp_path, capsys, expr):
    path = tmp_path / "rem.tile"
    path.write_text(_one_stage(expr))
    with pytest.raises(CompileError) as e:
        tilec.compile(path, world=2)
    (d,) = e.value.diagnostics
    assert (d.loc.line, "'%' is only for index and size arithmetic") == (7, d.message[:41]), d
    assert cli_main(["check", str(path), "--world", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err and err.startswith(f"{path}:7:")


def test_remainder_of_constants_folds_and_by_zero_is_an_error(tmp_path):
    path = tmp_path / "rem.tile"
    path.write_text(_one_stage("X[m] * (M % 3) + 7 % 0"))
    with pytest.raises(CompileError, match="division by zero"):
        tilec.compile(path, world=1)
    path.write_text(_one_stage("X[m] * (M % 3) + (BM + 3) % 4"))
    prog = tilec.compile(path, world=1)
    x = torch.arange(10.0)
    assert torch.equal(evaluate(prog.program, [{"X": x}])[0]["C"], x * 1 + 3)


# -- stored constants ---------------------------------------------------------------------------------------------

# (expression, output dtype, its value)
CONSTANTS = [("3.5", "f32", 3.5), ("7", "f32", 7.0), ("0", "i32", 0), ("7", "i32", 7), ("-2", "i32", -2),
             ("f16(1.5)", "f32", 1.5), ("bf16(2)", "f16", 2.0), ("f32(0.25)", "bf16", 0.25), ("2.5", "f16", 2.5),
             ("M * 2 + BM", "i32", 24), ("(M % 4) * 1.5", "f32", 3.0), ("f16(M)", "f32", 10.0),
             ("exp(0.0)", "f32", 1.0), ("max(1, 2)", "i32", 2)]


def _constants_program() -> str:
    outs = "".join(f"  out C{i} : {dt}[M, N]\n" for i, (_e, dt, _v) in enumerate(CONSTANTS))
    body = "".join(f"    C{i}[m, n] = {e}\n" for i, (e, _dt, _v) in enumerate(CONSTANTS))
    return ("program consts(world W)\n  dims M = 10, N = 3\n  tiles BM = 4, BN = 2\n" + outs +
            "  stage s over m in M by BM, n in N by BN:\n" + body)


# -- single elements of 1-d tensors as scalars ---------------------------------------------------------------------

# (expression over the [BM, BN] tile X[m, n] and the 1-d v (f32) and c (i32), its torch model)
SCALARS = [("X[m, n] * v[3]", lambda x, v, c: x * v[3]), ("v[0] - X[m, n]", lambda x, v, c: v[0] - x),
           ("max(X[m, n], v[1])", lambda x, v, c: torch.maximum(x, v[1])),
           ("min(c[0], X[m, n])", lambda x, v, c: torch.minimum(c[0], x)),
           ("X[m, n] * (c[1] + 1) + c[2] * v[2]", lambda x, v, c: x * (c[1] + 1) + c[2] * v[2]),
           ("exp(v[0]) * X[m, n] - min(c[0], c[1])", lambda x, v, c: torch.exp(v[0]) * x - torch.minimum(c[0], c[1])),
           ("(sum r in ranks: Xs@r[m, n]) * v[3]", lambda x, v, c: x * v[3])]  # Xs is X at world 1


def _scalars_program() -> str:
    outs = "".join(f"  out Y{i} : f32[M, N]\n" for i in range(len(SCALARS)))
    body = "".join(f"    Y{i}[m, n] = {e}\n" for i, (e, _f) in enumerate(SCALARS))
    return ("program scalars(world W)\n  dims M = 10, N = 6\n  tiles BM = 8, BN = 4\n  in X : f32[M, N]\n"
            "  in Xs : f32[M, N] symmetric\n  in v : f32[4]\n  in c : i32[3]\n" + outs +
            "  stage s over m in M by BM, n in N by BN:\n" + body)


def _scalars_model(ins, r):
    x, v, c = (ins[r][n].float() for n in ("X", "v", "c"))
    out = {f"Y{i}": f(x, v, c) for i, (_e, f) in enumerate(SCALARS[:-1])}
    out[f"Y{len(SCALARS) - 1}"] = sum(d["Xs"].float() for d in ins) * v[3]
    return out


# -- tiles stored with their unit dims elsewhere ---------------------------------------------------------------------

# (value of Z[r, m] from rank r's column pair Y@r[m, 0], Y@r[m, 1], its torch model of one rank's Y)
TRANSPOSED = [("Y@r[m, 0]", lambda y: y[:, 0]), ("Y@r[m, 1] * 2", lambda y: y[:, 1] * 2),
              ("Y@r[m, 0] + Y@r[m, 1]", lambda y: y[:, 0] + y[:, 1]), ("f32(Y@r[m, 1])", lambda y: y[:, 1])]


def _transposed_program(expr: str) -> str:
    return ("program tr(world W)\n  dims M = 10\n  tiles BM = 4\n  in X : f32[M, 2]\n  buf Y : f32[M, 2] symmetric\n"
            "  out Z : f32[W, M]\n  out V : f32[M, 1]\n  stage a over m in M by BM:\n    Y[m, 0] = X[m, 1] * 2\n"
            "    Y[m, 1] = X[m, 0] - 1\n  barrier\n  stage b over r in ranks, m in M by BM:\n"
            f"    Z[r, m] = {expr}\n  stage v over m in M by BM:\n    V[m, 0] = Y[m, 0]\n")


def _transposed_model(fn):
    def model(ins, r):
        ys = [torch.stack([d["X"].float()[:, 1] * 2, d["X"].float()[:, 0] - 1], 1) for d in ins]
        return {"Z": torch.stack([fn(y) for y in ys]), "V": ys[r][:, :1]}
    return model


# -- ragged sums over tile loops ----------------------------------------------------------------------------------

# (body over the tile X[m, k], torch of it); K ragged against BK = 16, and one K shorter than a tile
BODIES = [("exp(X[m, k] * 0.5)", lambda x: torch.exp(x * 0.5)), ("X[m, k] + 1", lambda x: x + 1),
          ("sigmoid(X[m, k])", torch.sigmoid), ("X[m, k] * X[m, k] - 2", lambda x: x * x - 2),
          ("X[m, k]", lambda x: x)]
KS = (20, 9, 33)


def _tile_sum_program(body: str, k: int) -> str:
    return (f"program tsum(world W)\n  dims M = 12, K = {k}\n  tiles BM = 8, BK = 16\n  in X : f32[M, K]\n"
            f"  out C : f32[M, BK]\n  stage s over m in M by BM, n in BK by BK:\n"
            f"    C[m, n] = sum k in K by BK: {body}\n")


def _tile_sum_model(fn, k):
    def model(ins, r):
        x = fn(ins[r]["X"].float())
        pad = -k % 16
        return {"C": torch.nn.functional.pad(x, (0, pad)).reshape(12, -1, 16).sum(1)}
    return model


def _dot_program(k: int) -> str:
    return (f"program tdot(world W)\n  dims M = 12, N = 10, K = {k}\n  tiles BM = 16, BN = 16, BK = 16\n"
            f"  in A : f32[M, K]\n  in B : f32[K, N]\n  out C : f32[M, N]\n"
            f"  stage g over m in M by BM, n in N by BN:\n"
            f"    C[m, n] = sum k in K by BK: exp(A[m, k] * 0.1) @ (B[k, n] + 1)\n")


def _dot_model(ins, r):
    return {"C": torch.exp(ins[r]["A"].float() * 0.1) @ (ins[r]["B"].float() + 1)}


def cases():
    """(case id, program text, torch model)"""
    out = [("constants", _constants_program(),
            lambda ins, r: {f"C{i}": torch.full((10, 3), float(v)) for i, (_e, _dt, v) in enumerate(CONSTANTS)})]
    out += [("scalars", _scalars_program(), _scalars_model)]
    out += [(f"transposed-{i}", _transposed_program(e), _transposed_model(f))
            for i, (e, f) in enumerate(TRANSPOSED)]
    out += [(f"tile-sum-{i}-K{k}", _tile_sum_program(b, k), _tile_sum_model(fn, k))
            for i, (b, fn) in enumerate(BODIES) for k in KS]
    out += [(f"dot-K{k}", _dot_program(k), _dot_model) for k in KS]
    return out


CASES = cases()
WORLDS = (1, 2)
# the cases that run at world 2 too (the others do not depend on the world)
AT_WORLD_2 = ("constants", "scalars", "tile-sum-0-K20", "dot-K9", *(f"transposed-{i}" for i in range(len(TRANSPOSED))))
SCHEDULE = {1: "bsp", 2: "flags"}


def _compile(text: str, world: int):
    return tilec.compile("redteam.tile", world=world, schedule=SCHEDULE[world], source=text)


@pytest.fixture(scope="module", params=WORLDS, ids=lambda w: f"w{w}")
def ran(request):
    world = request.param
    batch, meta = [], {}
    for i, (cid, text, model) in enumerate(CASES):
        if world > 1 and cid not in AT_WORLD_2:
            continue
        prog = _compile(text, world)
        calls = make_calls(prog, 1, seed=900 + i)
        meta[cid] = (prog, calls, model)
        batch.append((cid, prog, calls, ()))
    return world, meta, spawn(_workers.run_cases, world, heap_bytes=1 << 23, timeout=600, args=(batch,))


def _check(got: dict, want: dict, what: str) -> None:
    assert set(got) == set(want), what
    for name, w in want.items():
        err = rel_err(got[name], w)
        tol = 2e-2 if got[name].dtype in (torch.float16, torch.bfloat16) else 1e-4
        assert err <= tol, f"{what} {name}: relative error {err:.3g}"


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_kernels_match_torch(ran, case):
    world, meta, results = ran
    if case not in meta:
        pytest.skip("run at world 1 only")
    prog, calls, model = meta[case]
    for r in range(world):
        _check(results[r][case][0], model(calls[0], r), f"{case} {SCHEDULE[world]} world {world} rank {r}")


@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_reference_matches_torch(case):
    _cid, text, model = next(c for c in CASES if c[0] == case)
    prog = _compile(text, 2)
    calls = make_calls(prog, 1, seed=5)[0]
    ref = evaluate(prog.program, calls)
    for r in range(2):
        _check({n: ref[r][n] for n in model(calls, r)}, model(calls, r), f"{case} reference rank {r}")


# -- a bad dim or tile value is one error, not a cascade of checks made with a placeholder -------------------------

SEEDS = sorted((ROOT / "examples").glob("*.tile")) + sorted((ROOT / "tests" / "programs").glob("*.tile"))


def _bad_values():
    for path in SEEDS:
        ast_prog = parse(path.read_text(), str(path))
        for d in ast_prog.dims:
            for v in (0, -3, 2**41):
                yield path, d.name, v
        for t in ast_prog.tiles:
            for v in (0, 3, 2**25 + 1, 2**41):
                yield path, t.name, v


BAD_VALUES = list(_bad_values())


@pytest.mark.parametrize("path,name,value", BAD_VALUES,
                         ids=[f"{p.stem}-{n}={v}" for p, n, v in BAD_VALUES])
def test_a_bad_dim_or_tile_value_is_one_error(path, name, value):
    with pytest.raises(CompileError) as e:
        tilec.compile(path, world=2, dims={name: value})
    msgs = [f"{d.loc.line}:{d.loc.col}: {d.message}" for d in e.value.diagnostics]
    assert len(msgs) == 1 and f"'{name}'" in msgs[0], msgs


# -- a stage that stores nothing -----------------------------------------------------------------------------------

DISCARDS = ["_ = X[m, n]", "_ = sum k in K by BK: A[m, k] @ B[k, n]", "_, _ = attend(Q[:, :], Kc[:, :], Kc[:, :], 4)",
            "_, _ = lse_merge(Kc[:, :], Kc[:, 0])", "_ = X[m, n]\n    _ = X[m, n] * 2"]


@pytest.mark.parametrize("body", DISCARDS)
def test_a_stage_that_stores_nothing_is_a_located_error(tmp_path, body):
    path = tmp_path / "discard.tile"
    path.write_text("program p(world W)\n  dims M = 8, N = 8, K = 8\n  tiles BM = 8, BN = 8, BK = 8\n"
                    "  in X : f32[M, N]\n  in A : f32[M, K]\n  in B : f32[K, N]\n  in Q : f32[2, 8]\n"
                    "  in Kc : f32[8, 8]\n  out C : f32[M, N]\n"
                    "  stage c over m in M by BM, n in N by BN:\n    C[m, n] = X[m, n]\n"
                    f"  stage s over m in M by BM, n in N by BN:\n    {body}\n")
    for schedule in ("bsp", "fused-pull", "fused-push"):
        with pytest.raises(CompileError) as e:
            tilec.compile(path, world=2, schedule=schedule)
        (d,) = e.value.diagnostics
        assert (d.loc.line, d.message) == (12, "stage 's' stores nothing: every target of its statements is `_`")


# -- outputs a program writes only in part --------------------------------------------------------------------------

# (declaration, statement): rows past the loop, columns past it, an i32 output, one block of a 2-d output
PARTIAL = [("out R : f32[M]", "R[m] = X[m] + 1"), ("out P : f32[M, 6]", "P[m, 2] = X[m] * 2"),
           ("out I : i32[M]", "I[m] = c[m] * 3"), ("out Q : f32[2*M, 4]", "Q[M + m, 1] = X[m] - 1")]


def test_tilec_run_accepts_outputs_written_in_part():
    """`tilec run` poisons outputs before each call; the reference started them at zero, so a valid program that
    leaves elements of an output alone was reported as a wrong result (exit 1)."""
    from tilec.run_vs_reference import run_program

    decls = "".join(f"  {d}\n" for d, _s in PARTIAL)
    body = "".join(f"    {s}\n" for _d, s in PARTIAL)
    text = ("program partial(world W)\n  dims M = 16, ME = 10\n  tiles BM = 8\n  in X : f32[M]\n  in c : i32[M]\n"
            + decls + "  stage s over m in ME by BM:\n" + body)
    prog = tilec.compile("partial.tile", world=2, schedule="flags", source=text)
    rows, _times = run_program(prog, repeat=1, timeout=300)
    assert len(rows) == 2 * len(PARTIAL) and all(r.ok for r in rows), [r for r in rows if not r.ok]
    ref = evaluate(prog.program, [{"X": torch.ones(16), "c": torch.ones(16, dtype=torch.int32)}] * 2,
                   outputs_start={"R": torch.tensor(7.0), "P": torch.tensor(7.0), "I": torch.tensor(-1),
                                  "Q": torch.tensor(7.0)})
    assert ref[0]["R"].tolist() == [2.0] * 10 + [7.0] * 6 and ref[1]["I"].tolist() == [3] * 10 + [-1] * 6
