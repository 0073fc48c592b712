"""The kernel IR's rewrites (tilec/codegen/rewrites.py), each alone on a hand-written tree, and its Iris/Triton
printer: parentheses only where Python needs them, device operations spelled through the op table, long lines
broken inside parentheses."""

from __future__ import annotations

import ast

from tilec.codegen import kir as K
from tilec.codegen import rewrites as R
from tilec.codegen.triton_printer import OP_SPELLING, Printer, expr


def n(x: str) -> K.Name:
    return K.Name(x)


def c(v) -> K.Const:
    return K.Const(v)


def b(op: str, x, y) -> K.Bin:
    return K.Bin(op, x, y)


def arange(lo: int, hi: int) -> K.Call:
    return K.Call("tl.arange", (c(lo), c(hi)))


def text(body) -> list[str]:
    return Printer().body(tuple(body), "")


def fn(*body, params=("t",)) -> K.Fn:
    return K.Fn("f", tuple(K.Param(p) for p in params), tuple(body))


# -- the printer --------------------------------------------------------------------------------------------
def test_printer_parenthesizes_only_where_python_needs_it():
    cases = {
        b("*", b("+", n("a"), n("b")), c(4)): "(a + b) * 4",
        b("+", n("a"), b("*", n("b"), c(4))): "a + b * 4",
        b("-", n("a"), b("-", n("b"), n("c"))): "a - (b - c)",
        b("-", b("-", n("a"), n("b")), n("c")): "a - b - c",
        b("&", b("<", n("a"), c(3)), b("<", n("b"), c(4))): "(a < 3) & (b < 4)",
        K.Index(b("+", n("m"), n("r")), (K.Slice(), c(None))): "(m + r)[:, None]",
        K.Call(K.Attr(b("*", n("a"), n("b")), "to"), (n("tl.float16"),)): "(a * b).to(tl.float16)",
        K.Unary("-", b("+", n("a"), n("b"))): "-(a + b)",
        K.Call("tl.reshape", (n("x"), K.Tuple((c(64),)))): "tl.reshape(x, (64,))",
        K.Call("load", (n("p"), K.Kw("mask", n("m")), K.Kw("other", c(0)))): "tl.load(p, mask=m, other=0)",
        K.Call("wait", (n("f"), c("sys"))): 'td.wait(f, "sys")',
    }
    for e, want in cases.items():
        assert expr(e) == want
        assert ast.dump(ast.parse(want, mode="eval")) == ast.dump(ast.parse(expr(e), mode="eval"))


def test_every_device_operation_has_a_spelling():
    assert set(OP_SPELLING) == set(K.OPS)
    assert expr(K.Call("remote_load", (n("p"), n("rank"), n("r"), n("heap_bases")))) == \
        "iris.load(p, rank, r, heap_bases)"


def test_long_lines_break_inside_parentheses_at_120_columns():
    terms = n("A")
    for i in range(12):
        terms = b("+", terms, b("*", n(f"offset_{i}"), c(4096)))
    lines = text([K.Do(K.Call("store", (terms, n("value"), K.Kw("mask", n("mask")))))])
    assert len(lines) > 1 and all(len(ln) <= 120 for ln in lines)
    assert ast.dump(ast.parse("\n".join(lines))) == ast.dump(ast.parse(f"tl.store({expr(terms)}, value, mask=mask)"))
    lines = text([K.Assign(n("last"), terms)])
    assert len(lines) > 1 and all(len(ln) <= 120 for ln in lines)
    assert ast.dump(ast.parse("\n".join(lines))) == ast.dump(ast.parse(f"last = {expr(terms)}"))


def test_assemble_nests_placed_statements_by_their_indentation():
    from tilec.codegen.build import At, E, assemble, assign, call

    wait = K.Do(call("wait", b("+", n("F"), n("ctr")), K.Const("sys")))
    body = assemble([
        At("", K.Comment("a comment")),
        At("", K.For("ctr", n("lo"), b("+", n("last"), c(1)), None, (), "one counter")),  # opens a block
        At("    ", wait),
        At("", K.If(b("<", n("x"), c(4)), ())),
        At("    ", assign("y", 1)),
        At("", assign("z", E("tl.float32"))),
    ])
    assert text(body) == [
        "# a comment",
        "for ctr in range(lo, last + 1):  # one counter",
        '    td.wait(F + ctr, "sys")',
        "if x < 4:",
        "    y = 1",
        "z = tl.float32",
    ]
    assert body[1].body[0].expr.fn == "wait"  # a device operation, not its spelling
    try:
        assemble([At("    ", wait)])
    except Exception as e:
        assert "unexpected indent" in str(e)
    else:
        raise AssertionError("a statement deeper than any open block was placed")


# -- the rewrites, one at a time -------------------------------------------------------------------------------
def test_fold_drops_identities_and_joins_adjacent_constants():
    cases = [
        (b("+", n("x"), c(0)), "x"),
        (b("*", n("x"), c(1)), "x"),
        (b("*", c(1), n("x")), "x"),
        (b("//", n("x"), c(1)), "x"),
        (b("-", b("+", b("+", n("lo"), c(0)), c(64)), c(1)), "lo + 63"),
        (b("*", c(4), c(16)), "64"),
        (b("//", c(0), c(4)), "0"),
        (b("+", b("+", n("x"), c(3)), n("y")), "x + 3 + y"),  # no reordering of terms
        (b("//", c(-3), c(2)), "-3 // 2"),  # Python and C disagree: left alone
    ]
    for e, want in cases:
        assert expr(R.fold(e)) == want


def test_propagate_replaces_names_bound_to_a_constant_or_a_copy():
    f = fn(K.Assign(n("q"), c(0)), K.Assign(n("b2"), n("t")),
           K.Do(K.Call("release", (b("+", b("//", n("q"), c(4)), n("b2")),))))
    assert text(R.propagate(f).body) == ["td.release(0 // 4 + t)"]
    twice = fn(K.Assign(n("x"), c(0)), K.Assign(n("x"), b("+", n("x"), n("t"))), K.Do(K.Call("g", (n("x"),))))
    assert R.propagate(twice) == twice  # bound twice: not a constant
    looped = fn(K.For("h", c(0), c(4), None, (K.Assign(n("y"), n("h")), K.Do(K.Call("g", (n("y"),))))))
    assert R.propagate(looped) == looped  # a loop variable changes: its copy stays


def test_merge_reassign_joins_a_name_and_its_update():
    body = (K.Assign(n("idx"), c(0)), K.Assign(n("idx"), b("+", n("idx"), arange(0, 32))),
            K.Do(K.Call("g", (n("idx"),))))
    assert text(R.merge_reassign(body)) == ["idx = 0 + tl.arange(0, 32)", "g(idx)"]
    twice = (K.Assign(n("x"), n("a")), K.Assign(n("x"), b("*", n("x"), n("x"))))
    assert R.merge_reassign(twice) == twice  # read twice: a would be computed twice


def test_unroll_one_trip_loops():
    wait = K.Do(K.Call("wait", (b("+", n("F"), n("ctr")),)))
    one = K.For("ctr", n("b"), b("+", n("b"), c(1)), None, (wait,))
    assert text(R.unroll_one_trip((one,))) == ["ctr = b", "td.wait(F + ctr)"]
    block = K.For("ctr", c(0), b("+", c(1), c(1)), c(2), (wait,))  # a block of two counters: one trip
    assert text(R.unroll_one_trip((block,))) == ["ctr = 0", "td.wait(F + ctr)"]
    two = K.For("ctr", n("b"), b("+", n("b"), c(2)), None, (wait,))
    unknown = K.For("ctr", n("a"), n("b"), None, (wait,))
    assert R.unroll_one_trip((two, unknown)) == (two, unknown)


def test_drop_dead_keeps_effects_and_values_read_on_later_trips():
    body = (
        K.Assign(n("k_r"), arange(0, 32)),  # read before the loop: live
        K.Assign(n("ptrs"), b("+", n("B"), n("k_r"))),
        K.For("k", c(0), c(128), c(32), (
            K.Assign(n("k_r"), b("+", n("k"), arange(0, 32))),  # never read again: dead
            K.Assign(n("x"), K.Call("load", (n("ptrs"),))),  # a load is kept even when unread
            K.AugAssign(n("ptrs"), "+", c(32)),  # read by the next trip's load
        )),
        K.Assign(n("unused"), b("*", n("t"), c(2))),
    )
    assert text(R.drop_dead(body)) == [
        "k_r = tl.arange(0, 32)",
        "ptrs = B + k_r",
        "for k in range(0, 128, 32):",
        "    x = tl.load(ptrs)",
        "    ptrs += 32",
    ]


def test_share_common_binds_equal_values_once_keeping_a_meaningful_name():
    hint = K.Call("tl.max_contiguous", (arange(0, 64), c(64)))
    f = fn(K.Assign(n("idx_2"), hint), K.Assign(n("k_r"), hint),
           K.Do(K.Call("store", (b("+", n("idx_2"), n("k_r")),))))
    assert text(R.share_common(f, frozenset({"k_r"})).body) == [
        "k_r = tl.max_contiguous(tl.arange(0, 64), 64)", "tl.store(k_r + k_r)"]


def test_inline_once_writes_small_values_where_they_are_read_but_not_into_loops_or_kept_names():
    f = fn(K.Assign(n("mul"), b("*", n("t"), c(128))),
           K.Assign(n("sub"), b("-", n("x"), n("mul"))),
           K.Assign(n("m"), b("*", n("t"), c(64))),
           K.For("i", c(0), c(4), None, (K.Do(K.Call("g", (n("sub"), n("m")))),)),
           params=("t", "x"))
    assert text(R.inline_once(f, frozenset({"m"})).body) == [
        "sub = x - t * 128",  # mul is read once, right here
        "m = t * 64",  # a loop variable's name: kept
        "for i in range(0, 4):",
        "    g(sub, m)",  # sub is read in a loop: not moved into it
    ]


def test_drop_unused_params_trims_the_calls_too():
    task = K.Fn("leaf_task", (K.Param("t"), K.Param("A"), K.Param("B"), K.Param("UPCAST", True)),
                (K.Do(K.Call("store", (b("+", n("A"), n("t")),))),))
    mid = K.Fn("mid_task", (K.Param("t"), K.Param("A"), K.Param("B"), K.Param("UPCAST", True)),
               (K.Do(K.Call("leaf_task", (n("t"), n("A"), n("B"), n("UPCAST")))),))
    entry = K.Fn("k0", (K.Param("A"), K.Param("B"), K.Param("UPCAST", True)),
                 (K.Do(K.Call("mid_task", (c(0), n("A"), n("B"), n("UPCAST")))),))
    k = R.drop_unused_params(K.Kernel(entry, (mid, task)))
    assert [p.name for p in k.tasks[0].params] == ["t", "A"] == [p.name for p in k.tasks[1].params]
    assert text(k.entry.body) == ["mid_task(0, A)"] and [p.name for p in k.entry.params] == ["A", "B", "UPCAST"]


def test_materialize_binds_numbers_that_must_be_tensors():
    # propagation leaves `tl.broadcast_to(-2, ...)` and `(3).to(...)`: Triton takes neither as a tensor, while an
    # assigned number becomes one (int32 / fp32); numbers elsewhere stay where they are
    spread = K.Call("tl.broadcast_to", (K.Unary("-", c(2)), K.Tuple((c(4), c(2)))))
    cast = K.Call(K.Attr(c(3), "to"), (n("tl.float32"),))
    keep = K.Call("tl.maximum", (c(1), n("t")))
    out = R.materialize(fn(K.Do(spread), K.Assign(n("x"), b("*", cast, keep)), K.Do(K.Call("use", (n("x"),)))))
    assert text(out.body) == [
        "const_val = -2",
        "tl.broadcast_to(const_val, (4, 2))",
        "const_val_2 = 3",
        "x = const_val_2.to(tl.float32) * tl.maximum(1, t)",
        "use(x)",
    ]
    assert R.materialize(out) == out  # names are tensors already


def test_bind_constants_reads_a_known_parameter_as_its_value_where_no_function_binds_it():
    task = K.Fn("leaf_task", (K.Param("t"), K.Param("rank")),
                (K.Do(K.Call("store", (b("+", n("t"), b("*", n("rank"), c(16))),))),))
    own = K.Fn("own_task", (K.Param("t"),), (K.Assign(n("rank"), c(3)), K.Do(K.Call("use", (n("rank"),)))))
    entry = K.Fn("k0", (K.Param("rank"),), (K.Do(K.Call("leaf_task", (c(0), n("rank")))),))
    k = R.simplify(R.bind_constants(K.Kernel(entry, (task, own)), {"rank": 0}))
    assert text(k.tasks[0].body) == ["tl.store(t)"] and [p.name for p in k.tasks[0].params] == ["t"]
    assert text(k.entry.body) == ["leaf_task(0)"] and [p.name for p in k.entry.params] == ["rank"]  # the launch's
    assert "use(" in "\n".join(text(k.tasks[1].body)) and "3" in "\n".join(text(k.tasks[1].body))  # its own rank


def test_build_sums_continue_a_chain_as_index_arithmetic_reads():
    from tilec.codegen import build as B

    x = B.add("F", B.add("a", B.mul(2, "b")), B.sub("c", 1))
    assert expr(x) == "F + a + 2 * b + c - 1"
    assert x == b("-", b("+", b("+", b("+", n("F"), n("a")), b("*", c(2), n("b"))), n("c")), c(1))
    assert expr(B.mul(B.add("a", 1), 4)) == "(a + 1) * 4" and expr(B.add()) == "0" and B.E(-3) == K.Unary("-", c(3))
    blk = B.Block()
    blk.open_for("i", 0, 4)
    blk.add(B.assign("x", "i"))
    blk.open_if(B.cmp("x", ">", 1))
    blk.add(B.do(B.call("use", "x", mask="m")))
    assert text(blk.done()) == ["for i in range(0, 4):", "    x = i", "    if x > 1:", "        use(x, mask=m)"]


def test_no_codegen_module_parses_text():
    """The emitters build the tree; nothing in codegen reads emitted text back (no ast, no compile of a line)."""
    import pathlib

    import tilec.codegen

    root = pathlib.Path(tilec.codegen.__file__).parent
    tree_of = {p.name: ast.parse(p.read_text()) for p in root.glob("*.py")}
    assert "emit.py" in tree_of and "lift.py" not in tree_of
    for name, tree in tree_of.items():
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
                    for a in n.names} | {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "ast" not in imported, name
