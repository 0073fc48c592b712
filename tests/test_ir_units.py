"""Small units: affine index arithmetic, the trip-count helper, the affine evaluator of .tile expressions (against
Python's own arithmetic), the affine inversion behind flags and fused-pull (brute force against the
forward map), the expression printer, and the reference interpreter against torch (in this process)."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch

from tests._util import cat_shards, compile_example, compile_program, make_calls, rel_err
from tilec.errors import Loc, ScheduleError
from tilec.frontend import ast
from tilec.frontend.affine import NotAffine, affine
from tilec.ir.graph import Stage, stage
from tilec.ir.printer import fmt_expr
from tilec.ir.tiling import flag_size, invert, strides
from tilec.ir.types import ME, Access, Affine, Const, Op, Var, trips
from tilec.reference import evaluate


def test_affine_arithmetic():
    a = Affine((("m", 1), ("r", 33)), 5)
    assert str(a) == "m + 33*r + 5" and a.coef("r") == 33 and a.coef("k") == 0 and a.vars == ("m", "r")
    assert a.subst("r", Affine((("q", 2),), 1)) == Affine((("m", 1), ("q", 66)), 38)
    assert a.subst("k", Affine((), 9)) is a
    assert a.rename({"r": "rank"}) == Affine((("m", 1), ("rank", 33)), 5)
    assert a.rename({"r": "m"}) == Affine((("m", 34),), 5)
    assert str(Affine((), 0)) == "0"


L = Loc("t.tile", 3, 7)


def test_trips_and_stage_tasks():
    m, k, r = Var("m", "tile", 100, 32, L), Var("k", "tile", 64, 64, L), Var("r", "rank", 3, 1, L)
    assert (m.trips, k.trips, trips([]), trips([m, k, r]), trips(v for v in (m, r))) == (4, 1, 1, 12, 12)
    st = Stage("s", (r, m), (), L)
    assert st.tasks(3) == 12
    assert Stage("s", (r, m), (), L, skip_equal=(("r", ME),)).tasks(3) == 8  # one of 3 ranks skipped


def _e(src):
    """A tiny builder of .tile index expressions: nested tuples (op, lhs, rhs), ints and names."""
    if isinstance(src, int):
        return ast.Int(src, L)
    if isinstance(src, str):
        return ast.Name(src, L)
    if src[0] == "neg":
        return ast.Neg(_e(src[1]), L)
    return ast.BinOp(src[0], _e(src[1]), _e(src[2]), L)


def _py(src, env):
    if isinstance(src, int):
        return Fraction(src)
    if isinstance(src, str):
        return Fraction(env[src])
    if src[0] == "neg":
        return -_py(src[1], env)
    a, b = _py(src[1], env), _py(src[2], env)
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else None, "%": a % b if b else None}[src[0]]


@pytest.mark.parametrize("src", [
    ("+", ("*", 3, "m"), ("-", "K", ("/", "r", 2))),
    ("/", ("+", ("*", "W", "m"), "M"), "W"),
    ("neg", ("-", ("*", ("%", "M", 3), "r"), ("*", "m", ("/", "M", "W")))),
    ("*", ("+", 1, "r"), ("-", 2, 5)),
])
def test_affine_evaluator_agrees_with_python(src):
    """The form (terms, const) at every point of a small grid equals the expression evaluated directly."""
    dims = {"M": 10, "K": 7, "W": 4}
    terms, const = affine(_e(src), dims, {"m", "r"})
    assert set(terms) <= {"m", "r"} and all(k != 0 for k in terms.values())
    for m, r in itertools.product(range(-2, 3), range(3)):
        want = _py(src, dims | {"m": m, "r": r})
        assert const + terms.get("m", 0) * m + terms.get("r", 0) * r == want


@pytest.mark.parametrize("src,msg", [
    (("*", "m", "r"), "product of two loop variables"),
    (("/", 8, "m"), "'/' by a loop variable"),
    (("%", "m", 4), "'%' of a loop variable"),
    (("/", "m", ("-", 2, 2)), "division by zero"),
    (("+", "m", "Z"), "unknown name 'Z'"),
])
def test_affine_evaluator_refuses_what_is_not_affine(src, msg):
    with pytest.raises(NotAffine, match=msg) as e:
        affine(_e(src), {}, {"m", "r"})
    assert e.value.loc == L


def test_affine_evaluator_keeps_fractions_exact():
    terms, const = affine(_e(("/", ("+", "m", 1), 3)), {}, {"m"})
    assert terms == {"m": Fraction(1, 3)} and const == Fraction(1, 3)
    assert affine(_e(("/", ("*", 6, "m"), 3)), {}, {"m"}) == ({"m": 2}, 0)  # whole results are ints again
    assert type(affine(_e(("/", 6, 3)), {}, ())[1]) is int


def test_printer_expressions():
    c = Const(2.0, "f32", (), None)
    assert fmt_expr(Op("+", (c, Op("neg", (c,), "f32", (), None)), "f32", (), None)) == "(2.0 + -2.0)"
    assert fmt_expr(Op("cast_f16", (c,), "f16", (), None)) == "f16(2.0)"
    assert fmt_expr(Op("max", (c, c), "f32", (), None)) == "max(2.0, 2.0)"


@pytest.mark.parametrize("world,m_total,bm", [(3, 99, 64), (2, 64, 64), (4, 4, 64), (3, 144, 16)])
def test_invert_matches_the_forward_map(world, m_total, bm):
    """Ag[r*M/W + m, k] = A@r[m, k]: every element of Ag maps back to the (r, m-tile) that wrote it."""
    prog = compile_example(world, "flags", {"M": m_total, "N": 40, "K": 40, "BM": bm})
    g = prog.graph
    gather = stage(g, "gather")
    write = gather.body[0].access
    loops = {v.name: v for v in gather.loops} | {ME: Var(ME, "me", world, 1, None)}
    dims = invert(write, loops, {"r", "m", "k"}, world, "test")
    d0, d1 = dims
    rows = m_total // world
    seen = np.full(m_total, -1)
    for r, m in itertools.product(range(world), range(0, rows, bm)):
        e = np.arange(r * rows + m, r * rows + min(m + bm, rows))
        assert d0.written(e).all()
        assert (d0.lin(e) == d0.lin_of(r, m // bm)).all()
        seen[e] = d0.lin_of(r, m // bm)
    assert (seen >= 0).all()
    assert d0.size == world * -(-rows // bm) and d1.size == -(-40 // 32)
    assert flag_size(dims) == d0.size * d1.size and strides(dims) == [d1.size, 1]
    assert not d0.written(np.array([-1, m_total])).any()


def test_invert_solves_reversed_rank_orders():
    """T[(W-1-r)*4 + m] (W = 4, m in 4 by 2): every element solves to the rank and tile that wrote it, and the
    counters (ranks counted from the last) grow with the element, so a read's counters are one range."""
    w = Access("T", ME, (Affine((("m", 1), ("r", -4)), 12),), ("m",), (2,), None)
    loops = {"r": Var("r", "rank", 4, 1, None), "m": Var("m", "tile", 4, 2, None)}
    (d,) = invert(w, loops, {"r", "m"}, 4, "test")
    e = np.arange(16)
    r, off = d.solve(e)
    assert (r == 3 - e // 4).all() and (off == e % 4).all() and d.written(e).all()
    for rv in range(4):
        for mv in (0, 2):
            x = 12 - 4 * rv + mv
            assert d.lin(np.array([x]))[0] == d.lin_of(rv, mv // 2)
    assert (np.diff(d.lin(e)) >= 0).all() and sorted(set(d.lin(e))) == list(range(8))
    assert not d.written(np.array([-1, 16])).any()


def test_invert_refuses_unit_step_loops_walked_backwards():
    w = Access("T", ME, (Affine((("j", -1),), 12),), (None,), (1,), None)
    with pytest.raises(ScheduleError, match=r"test: dim 0 of T\[-1\*j \+ 12\] walks unit-step loop 'j' backwards"):
        invert(w, {"j": Var("j", "tile", 13, 1, None)}, set(), 4, "test")


def test_reference_interpreter_agrees_with_torch():
    prog = compile_example(3, "bsp", {"M": 99, "N": 72, "K": 40})
    ins = make_calls(prog, 1, seed=3)[0]
    out = evaluate(prog.program, ins)
    a = cat_shards(ins, "A")
    for r in range(3):
        assert rel_err(out[r]["C"], a @ ins[r]["B"].float()) < 2e-2
        assert rel_err(out[r]["Ag"], a) == 0
    prog = compile_program("chain", 2, "bsp", {"M": 18, "K": 24})
    ins = make_calls(prog, 1, seed=4)[0]
    out = evaluate(prog.program, ins)
    for r in range(2):
        assert rel_err(out[r]["C"], torch.relu(cat_shards(ins, "X")) @ ins[r]["B"].float()) < 2e-2


def test_graph_state_accessors():
    """The graph's own state through one accessor each: before persist no kernels, after it the kernels it made."""
    from tilec.ir.graph import kernels_of, kind_of, node_order, passes_run, payload_of, persisted, program_of, sid

    prog = compile_example(2, "flags")
    lowered, final = prog.snapshots["lower"], prog.graph
    assert program_of(final) is program_of(lowered) and program_of(final).world == 2
    assert node_order(lowered) == ("s:gather", "b:0", "s:gemm") and kind_of(lowered, "b:0") == "barrier"
    assert not persisted(lowered) and kernels_of(lowered) == ()
    assert persisted(final) and [k.stages for k in kernels_of(final)] == [("gather",), ("gemm",)]
    assert passes_run(lowered) == ("lower",) and passes_run(final)[0] == "lower" and len(passes_run(final)) > 2
    assert payload_of(final, sid("gemm")) is stage(final, "gemm")
