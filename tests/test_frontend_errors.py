"""Parser and semantic errors: `CompileError.render()` (file:line:col, the source line, a caret) against goldens.

The malformed programs are tests/programs/errors/*.tile (syntax_*: the parser, sema_*: the semantic checks); a
`# world: N` line picks the world size (default 2). Besides the goldens, each case names the phrase its message
must contain, so a careless --update-golden cannot bless a wrong diagnostic.
"""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

import tilec
from tests._util import PROGRAMS, ROOT
from tilec.cli import main as cli_main
from tilec.errors import ArgumentError, CompileError, Diagnostic, Loc, ScheduleError
from tilec.frontend import limits
from tilec.frontend.limits import MAX_WORLD
from tilec.frontend.parser import parse
from tilec.passes.schedules import SCHEDULES

ERRORS = PROGRAMS / "errors"

EXPECT = {
    "syntax_missing_world": ["3:3:", "unexpected 'dims'", "(world W)"],
    "syntax_world_keyword": ["2:13:", "unexpected 'W'", "(world W)"],
    "syntax_tile_loop_without_by": ["unexpected ','", "a tile loop is `VAR in EXTENT by TILE`"],
    "syntax_tile_loop_without_in": ["unexpected 'by'", "expected `in`"],
    "syntax_stage_without_over": ["unexpected ':'", "expected `over`"],
    "syntax_missing_body": ["unexpected 'stage'"],
    "syntax_missing_body_eof": ["unexpected end of file", "a stage body is one or more assignments"],
    "syntax_tensor_decl_colon": ["unexpected 'f16'", "tensor declarations look like"],
    "syntax_tensor_decl_dtype": ["unknown dtype 'f64'", "the dtypes are f16, bf16, f32, i32"],
    "syntax_tensor_decl_no_dtype": ["unexpected '['", "expected a dtype: f16, bf16, f32, i32"],
    "syntax_stray_character": ["unexpected character '$'"],
    "syntax_unexpected_eof": ["unexpected end of file"],
    "syntax_unbalanced_bracket": ["unexpected '='"],
    "sema_unknown_name": ["unknown name 'Q'"],
    "sema_unknown_tensor": ["unknown tensor 'X'"],
    "sema_matmul_shape": ["shape mismatch in '@': [64, 32] @ [64, 32]"],
    "sema_matmul_dtype": ["dtype mismatch in '@': f16 @ f32"],
    "sema_tile_not_power_of_two": ["tile size 'BM' = 48 must be a power of two", "tile size of 'n' = 24"],
    "sema_not_integer": ["not an integer (100/3) in the shape of 'A' (M=100, W=3)", "loop extent is not an integer",
                         "index is not an integer for every tile (M=100, W=3)"],
    "sema_non_affine": ["index is not affine: product of two loop variables"],
    "sema_out_of_bounds": ["index out of bounds: dim 0 of 'C' reaches [64, 191] but its size is 128"],
    "sema_write_conflict": ["write conflict in stage 'gemm': tasks that differ only in 'k'"],
    "sema_write_input": ["'A' is an input ('in') and cannot be written"],
    "sema_peer_not_symmetric": ["'B' is not symmetric"],
    "sema_race": ["race: stage 'reduce' reads 'P@r[m, n]' which stage 'part' writes in the same phase"],
    "sema_race_push": ["race: stage 'copy' reads 'Ag[m, k]' which stage 'push' writes in the same phase"],
    "sema_read_before_write": ["stage 'use' reads 'P' before any stage writes it"],
    "sema_several": ["'BK' = 24", "unknown tensor 'X'", "not affine", "stage 'gemm' is already defined",
                     "'A' is an input"],
    "sema_output_never_written": ["output 'D' is never written"],
    "sema_store_shape": ["shape mismatch: storing a [64, 32] tile into a [64, 64] tile of 'C'"],
    "sema_peer_index_var": ["'m' in 'A@m' must be a rank loop variable or 'rank'"],
    "sema_index_count": ["'A' has 2 dims but is indexed with 1"],
    "sema_row_index_not_i32": ["9:17:", "row index 'idx' must be an i32 tensor, not f32"],
    "sema_row_index_not_1d": ["9:17:", "row index 'idx' must be 1-D, not 2-D"],
    "sema_scatter": ["9:9:", "a scatter writes this rank's own copy of 'C', not 'C@r'"],
    "sema_row_count_not_element": ["8:47:", "the count of loop 'c' must be one element of 'cnt'"],
    "sema_tensor_without_index": ["'A' is a tensor: read its tiles as `A[...]`"],
    "sema_cut_short": ["the program ends in the middle of an expression (is the file cut short?)",
                       "'Ag' is a tensor"],
}

CASES = sorted(p.stem for p in ERRORS.glob("*.tile"))


def _world(text: str) -> int:
    m = re.search(r"^# world: (\d+)", text, re.M)
    return int(m.group(1)) if m else 2


def compile_error(name: str) -> CompileError:
    text = (ERRORS / f"{name}.tile").read_text()
    with pytest.raises(CompileError) as info:
        tilec.compile(f"{name}.tile", world=_world(text), schedule="bsp", source=text)
    return info.value


def test_every_case_has_expectations():
    assert sorted(EXPECT) == CASES


@pytest.mark.parametrize("name", CASES)
def test_error_golden(name, golden):
    err = compile_error(name)
    text = err.render()
    golden(f"errors/{name}.txt", text + "\n")
    for phrase in EXPECT[name]:
        assert phrase in text, f"{phrase!r} not in:\n{text}"
    # every diagnostic: `file:line:col: error: message`, the source line, a caret under the column
    src = (ERRORS / f"{name}.tile").read_text().splitlines()
    blocks = text.split("\n")
    assert len(blocks) == 3 * len(err.diagnostics)
    for i, d in enumerate(err.diagnostics):
        head, line, caret = blocks[3 * i: 3 * i + 3]
        assert head == f"{name}.tile:{d.loc.line}:{d.loc.col}: error: {d.message}"
        assert line == "  " + src[d.loc.line - 1]
        assert caret.startswith("  " + " " * (d.loc.col - 1) + "^") and set(caret.strip()) == {"^"}
    assert str(err) == "\n".join(f"{d.loc}: error: {d.message}" for d in err.diagnostics)  # one line each


@pytest.mark.parametrize("name", [c for c in CASES if c.startswith("syntax_")])
def test_syntax_errors_are_single(name):
    assert len(compile_error(name).diagnostics) == 1


def test_several_errors_reported_together_sorted():
    err = compile_error("sema_several")
    assert len(err.diagnostics) == 5
    lines = [(d.loc.line, d.loc.col) for d in err.diagnostics]
    assert lines == sorted(lines)


def test_caret_spans_the_node():
    err = compile_error("sema_unknown_tensor")
    (d,) = err.diagnostics
    assert err.render().splitlines()[-1].strip() == "^" * len("X[k, n]")
    assert (d.loc.end_line, d.loc.end_col - d.loc.col) == (d.loc.line, len("X[k, n]"))


def test_diagnostic_render_edge_cases():
    d = Diagnostic(Loc("f.tile", 3, 5), "boom")
    assert d.render(None) == "f.tile:3:5: error: boom"
    assert d.render("one line\n") == "f.tile:3:5: error: boom"  # line past the end: no excerpt
    assert Diagnostic(Loc("f.tile", 0, 0), "unreadable").render("x") == "f.tile: error: unreadable"  # no position
    assert d.render("a\nb\n0123456789\n") == "f.tile:3:5: error: boom\n  0123456789\n      ^"


def test_dims_overrides_are_checked(example_source):
    with pytest.raises(CompileError) as info:
        tilec.compile("examples/ag_gemm.tile", world=2, dims={"Q": 3, "BN": 24}, source=example_source)
    msgs = [d.message for d in info.value.diagnostics]
    assert any("'BN' = 24 must be a power of two" in m for m in msgs)
    assert any("-D Q: the program has no dim or tile size named 'Q'" in m for m in msgs)


@pytest.mark.parametrize("world", [0, -3, MAX_WORLD + 1, 10**6])
def test_world_is_bounded(example_source, world):
    with pytest.raises(ArgumentError, match=rf"^world={world}: must be >= 1 and <= {MAX_WORLD}"):
        tilec.compile("examples/ag_gemm.tile", world=world, source=example_source)


@pytest.mark.parametrize("world", [True, 2.0, "2", None])
def test_world_must_be_an_integer(example_source, world):
    with pytest.raises(ArgumentError, match=r"^world=.*: must be an integer"):
        tilec.compile("examples/ag_gemm.tile", world=world, source=example_source)


@pytest.mark.parametrize("value", ["256", True, 2.5, 256.0, None, [256]])
def test_dim_values_must_be_integers(example_source, value):
    with pytest.raises(ArgumentError, match=r"^dims\['M'\] = .*: must be an integer"):
        tilec.compile("examples/ag_gemm.tile", world=2, dims={"N": 64, "M": value}, source=example_source)


def test_dims_must_be_a_mapping_of_names(example_source):
    with pytest.raises(ArgumentError, match=r"^dims=\[\('M', 64\)\]: must be a dict"):
        tilec.compile("examples/ag_gemm.tile", world=2, dims=[("M", 64)], source=example_source)
    with pytest.raises(ArgumentError, match=r"^dims: key 3 is not a dim"):
        tilec.compile("examples/ag_gemm.tile", world=2, dims={3: 64}, source=example_source)


def test_numpy_integers_are_integers(example_source):
    prog = tilec.compile("examples/ag_gemm.tile", world=np.int64(2), schedule="bsp", dims={"M": np.int32(128)},
                         source=example_source)
    assert dict(prog.program.dims)["M"] == 128 and type(dict(prog.program.dims)["M"]) is int


def test_missing_file():
    with pytest.raises(CompileError, match="cannot read program"):
        tilec.compile(ROOT / "no" / "such.tile")


def test_non_integer_loop_extent_names_values():
    err = compile_error("sema_not_integer")
    (loop,) = [d for d in err.diagnostics if "loop extent" in d.message]
    assert "M=100" in loop.message and "W=3" in loop.message


def test_no_cascading_error_after_bad_dim(example_source):
    with pytest.raises(CompileError) as info:
        tilec.compile("examples/ag_gemm.tile", world=2, dims={"M": 0}, source=example_source)
    assert not [d for d in info.value.diagnostics if "write conflict" in d.message]


HEADER = "program p(world W)\n  dims M = 128, K = 64\n  tiles BM = 64, BK = 32\n  in A : f16[M, K]\n" \
         "  out C : f16[M, K]\n"


@pytest.mark.parametrize("body,friendly", [
    ("  stage s over m in M, k in K by BK:\n    C[m, k] = A[m, k]\n", "a tile loop is `VAR in EXTENT by TILE`"),
    ("  stage s over m in M by BM, k in K by BK:\n  barrier\n", "a stage body is one or more assignments"),
    ("  in B f16[M]\n", "tensor declarations look like"),
], ids=["tile-loop", "stage-body", "tensor-decl"])
def test_friendly_syntax_messages_in_real_programs(body, friendly):
    with pytest.raises(CompileError) as info:
        parse(HEADER + body, "p.tile")
    assert friendly in info.value.diagnostics[0].message


def test_friendly_syntax_message_without_declarations():
    with pytest.raises(CompileError) as info:
        parse("program p(world W)\nstage s over m in M:\n  C[m] = A[m]\n", "p.tile")
    assert "a tile loop is `VAR in EXTENT by TILE`" in info.value.diagnostics[0].message


# -- the command line: exit code 2, the rendered diagnostics, no traceback ------------------------------------------


@pytest.mark.parametrize("name", ["syntax_stray_character", "sema_several"])
def test_cli_check_reports_errors(name, capsys):
    path = ERRORS / f"{name}.tile"
    rc = cli_main(["check", str(path), "--world", "2"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert "Traceback" not in err
    assert err.startswith(f"{path}:") and "error:" in err and "^" in err


def test_cli_check_subprocess_exit_code(tmp_path):
    bad = tmp_path / "bad.tile"
    bad.write_text((ERRORS / "sema_race.tile").read_text())
    p = subprocess.run([sys.executable, "-m", "tilec", "check", str(bad), "--world", "2"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    assert f"{bad}:12:31: error: race: stage 'reduce'" in p.stderr
    assert p.stderr.rstrip().endswith("^^^^^^^^^")


def test_cli_missing_file_and_bad_define(capsys):
    assert cli_main(["check", "no/such.tile"]) == 2
    assert "cannot read program" in capsys.readouterr().err
    assert cli_main(["check", str(ROOT / "examples" / "ag_gemm.tile"), "-D", "M=abc"]) == 2
    assert "-D M=abc: 'abc' is not an integer" in capsys.readouterr().err
    for w in ("0", "-1", str(MAX_WORLD + 1)):
        assert cli_main(["check", str(ROOT / "examples" / "ag_gemm.tile"), "--world", w]) == 2
        assert capsys.readouterr().err == f"--world {w}: must be >= 1 and <= {MAX_WORLD} (tilec's limit)\n"


def test_cli_world_size_from_the_environment_is_checked(capsys, monkeypatch):
    for env in ("abc", "0", str(MAX_WORLD + 1), ""):
        monkeypatch.setenv("WORLD_SIZE", env)
        assert cli_main(["check", str(ROOT / "examples" / "ag_gemm.tile")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"WORLD_SIZE={env!r}: must be an integer >= 1") and "Traceback" not in err


# -- inputs that used to raise Python exceptions: each a located error -----------------------------------------------


def located(data: bytes | str, tmp_path, world: int = 2, name: str = "p.tile", **kw) -> tuple[CompileError, str]:
    """Compile a file holding `data`; return its CompileError (exactly one diagnostic) and the rendered text."""
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    with pytest.raises(CompileError) as info:
        tilec.compile(path, world=world, schedule="bsp", **kw)
    err = info.value
    assert len(err.diagnostics) == 1, err.render()
    (d,) = err.diagnostics
    assert d.loc.file == str(path) and d.loc.line >= 1 and d.loc.col >= 1
    return err, err.render().replace(str(path), name)


@pytest.mark.parametrize("bad", [b"\xff", b"\x80", b"\xc3(", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
                                 b"\xc0\xaf"])
@pytest.mark.parametrize("where", ["comment", "name", "line-start"])
def test_invalid_utf8_is_located_at_its_first_byte(tmp_path, example_source, bad, where):
    lines = example_source.split("\n")
    row, col = {"comment": (1, 3), "name": (13, 9), "line-start": (16, 1)}[where]  # 1-based
    text = lines[row - 1]
    # non-ASCII but valid text before the bad byte: the column counts characters, not bytes
    prefix = text[:col - 1].replace("#", "\u00e9") if where == "comment" else text[:col - 1]
    lines[row - 1] = prefix + "\0" + text[col - 1:]
    data = "\n".join(lines).encode().replace(b"\0", bad)
    err, text = located(data, tmp_path)
    head, shown, caret = text.split("\n")
    assert head.startswith(f"p.tile:{row}:{col}: error: invalid UTF-8 byte(s) {bad[:1].hex()}")
    assert "a .tile program is UTF-8 text" in head
    assert caret == "  " + " " * (col - 1) + "^"
    rc = cli_main(["check", str(tmp_path / "p.tile"), "--world", "2"])
    assert rc == 2


def test_cli_invalid_utf8_one_line_no_traceback(tmp_path, capsys):
    path = tmp_path / "p.tile"
    path.write_bytes(b"program p(world W)\n  dims M = 64\xff\n")
    assert cli_main(["check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.splitlines()[0] == f"{path}:2:14: error: invalid UTF-8 byte(s) ff: a .tile program is UTF-8 text"


DEEP = {  # a tile expression nested n levels deep around `e`, in every way the grammar nests
    "sum-chain": lambda e, n: " + ".join([f"({e})"] * (n + 1)),
    "product-chain": lambda e, n: "(" + e + ")" + " * 1.0" * n,
    "right-products": lambda e, n: "1.0 * (" * n + e + ")" * n,
    "negations": lambda e, n: "-" * n + "(" + e + ")",
    "calls": lambda e, n: "exp(" * n + e + ")" * n,
    "binary-calls": lambda e, n: "max(0.0, " * n + e + ")" * n,
}
ELEMENTWISE = "tests/programs/elementwise.tile"


def _elementwise(n: int, kind: str) -> tuple[str, str]:
    src = (ROOT / ELEMENTWISE).read_text()
    m = re.search(r"^(\s+\w+\[[^\]]*\] = )(.+)$", src, re.M)
    return src, src[:m.start(2)] + DEEP[kind](m.group(2), n) + src[m.end(2):]


def _levels_for(kind: str, depth: int) -> int:
    """n such that _elementwise(n, kind) is `depth` deep (the nested statement is the deepest from n = 20 on)."""
    return depth - (_depth_of(_elementwise(20, kind)[1]) - 20)


def _depth_of(src: str) -> int:
    from tilec.frontend.parser import _EXPR_RULES, _parser

    def depth(t):
        kids = [depth(c) for c in t.children if hasattr(c, "data")]
        return (t.data in _EXPR_RULES) + max(kids, default=0)

    return depth(_parser().parse(src))


@pytest.mark.parametrize("kind", sorted(DEEP))
def test_expressions_up_to_the_depth_limit_compile_under_every_schedule(kind):
    n = _levels_for(kind, limits.MAX_DEPTH)
    _, src = _elementwise(n, kind)
    assert _depth_of(src) == limits.MAX_DEPTH
    for s in SCHEDULES:
        try:
            prog = tilec.compile(ELEMENTWISE, world=2, schedule=s, source=src)
        except ScheduleError:
            continue
        compile(prog.source, s, "exec")  # the generated module is valid Python (its parser has limits of its own)


@pytest.mark.parametrize("kind", sorted(DEEP))
@pytest.mark.parametrize("extra", [1, 300, 1000])
def test_deeper_expressions_are_located_errors(tmp_path, kind, extra):
    n = _levels_for(kind, limits.MAX_DEPTH + extra)
    _, src = _elementwise(n, kind)
    err, text = located(src, tmp_path)
    msg = err.diagnostics[0].message
    assert f"expression nested too deeply: {limits.MAX_DEPTH + extra} levels" in msg
    assert f"tilec's limit is {limits.MAX_DEPTH}" in msg


def test_a_300_term_sum_says_what_is_wrong(tmp_path):
    src = (ROOT / ELEMENTWISE).read_text()
    m = re.search(r"^(\s+\w+\[[^\]]*\] = )(.+)$", src, re.M)
    ref = re.search(r"\w+\[[^\]]*\]", m.group(2)).group(0)
    src = src[:m.start(2)] + " + ".join([ref] * 300) + src[m.end(2):]
    err, text = located(src, tmp_path)
    d = err.diagnostics[0]
    assert "expression nested too deeply: 300 levels" in d.message and "a chain like `a + b + c`" in d.message
    assert (d.loc.line, d.loc.col) == (src[:m.start(2)].count("\n") + 1, len(m.group(1)) + 1)


def test_deep_index_and_shape_expressions(tmp_path, example_source):
    deep = " + ".join(["0"] * 100)
    err, _ = located(example_source.replace("Ag[r*M/W + m, k]", f"Ag[r*M/W + m + {deep}, k]"), tmp_path)
    assert "nested too deeply" in err.diagnostics[0].message
    err, _ = located(example_source.replace("f16[M/W, K]", f"f16[M/W + {deep}, K]"), tmp_path)
    assert "nested too deeply" in err.diagnostics[0].message and err.diagnostics[0].loc.line == 8


@pytest.mark.parametrize("literal", ["1" + "0" * 30, "9" * 5000, str(2**40 + 1), "0" * 50 + str(2**41)])
@pytest.mark.parametrize("where", ["dim", "tile", "expr"])
def test_huge_integer_literals(tmp_path, example_source, literal, where):
    old = {"dim": "M = 256", "tile": "BN = 64", "expr": "r*M/W + m"}[where]
    new = {"dim": f"M = {literal}", "tile": f"BN = {literal}", "expr": f"r*M/W + m + {literal}"}[where]
    err, text = located(example_source.replace(old, new, 1), tmp_path)
    d = err.diagnostics[0]
    assert "is too large (tilec's limit is 2**40" in d.message
    assert text.split("\n")[2].strip() == "^" * len(literal)


def test_float_literal_overflow(tmp_path, example_source):
    src = example_source.replace("Ag[m, k] @ B[k, n]", "Ag[m, k] @ B[k, n] * 1e999")
    err, _ = located(src, tmp_path)
    assert "number 1e999 is too large for a float" in err.diagnostics[0].message


@pytest.mark.parametrize("define,phrase", [
    ({"M": 2**31}, "stage 'gather' has 134217728 tasks: too many (tilec's limit is 2**24"),
    ({"M": 2**40 + 1}, "dim 'M' = 1099511627777 is too large"),
    ({"M": 2**40, "K": 2**20}, "'A' has 576460752303423488 elements: too many"),
    ({"BM": 2**25}, "tile size 'BM' = 33554432 is too large (tilec's limit is 2**24"),
    ({"BM": 2**13, "BK": 2**12}, "a [8192, 4096] tile has 33554432 elements: too many"),
    ({"K": 2**30, "BK": 32}, "loop 'k' makes 33554432 trips: too many"),
])
def test_sizes_are_checked_before_anything_is_allocated(example_source, define, phrase):
    with pytest.raises(CompileError) as info:
        tilec.compile("examples/ag_gemm.tile", world=2, schedule="flags", dims=define, source=example_source)
    msgs = [d.message for d in info.value.diagnostics]
    assert any(phrase in m for m in msgs), msgs
    assert all(d.loc.line >= 1 and d.loc.col >= 1 for d in info.value.diagnostics)


def test_sizes_at_the_limits_are_accepted(example_source):
    """A real program's largest sizes compile: the limits are not where programs live (256x256 tiles 64 deep: three
    pipelined copies take 192 KiB of an H200's 227 KiB of shared memory; 128 deep they take 384 KiB, refused)."""
    prog = tilec.compile("examples/ag_gemm.tile", world=8, schedule="bsp", source=example_source,
                         dims={"M": 8192, "N": 28672, "K": 36864, "BM": 256, "BN": 256, "BK": 64})
    assert dict(prog.program.dims)["K"] == 36864


def test_too_many_loops_in_a_stage(tmp_path):
    src = (ROOT / "examples" / "flash_decode.tile").read_text()
    # every `:` slice is a one-trip loop of its stage: 40 of them exceed the limit
    m = re.search(r"O\[b, h, :\], _ = lse_merge\((.+)\)$", src, re.M)
    og = m.group(1).split(", Lg")[0]
    many = " + ".join([og] * 40)
    src = src[:m.start(1)] + many + ", Lg" + m.group(1).split(", Lg")[1] + src[m.end(1):]
    err, _ = located(src, tmp_path)
    assert f"(tilec's limit is {limits.MAX_LOOPS} together)" in err.diagnostics[0].message


def test_program_text_too_long(tmp_path, example_source):
    src = example_source + ("#" + "x" * 99 + "\n") * (limits.MAX_SOURCE // 100 + 1)
    err, _ = located(src, tmp_path)
    d = err.diagnostics[0]
    assert "too long (tilec's limit is" in d.message and d.loc.line > example_source.count("\n")


@pytest.mark.parametrize("sep", ["\x0c", "\x0b", "\x1c", "\u2028", "\x85", "\r"])
def test_caret_line_matches_the_parser_lines(tmp_path, example_source, sep):
    """Characters Python's splitlines() splits at, but the parser does not: the excerpt is the line it counted."""
    src = example_source.replace("# examples", f"#{sep} examples", 1).replace("A@r[m, k]", "A@r[m, k] $")
    err, text = located(src, tmp_path)
    assert "unexpected character '$'" in text and "A@r[m, k] $" in text.split("\n")[1]


def test_syntax_error_where_lark_match_examples_fails(tmp_path):
    """lark's match_examples raises TypeError (a %d of a ParserState in a debug message) on some states."""
    src = (ROOT / "examples" / "flash_decode.tile").read_text().replace("over b in B by 1, h", "over b in B 1, h", 1)
    err, text = located(src, tmp_path)
    assert text.startswith("p.tile:23:27: error: unexpected '1'")


@pytest.mark.parametrize("defines, msg", [
    (["M=4_8"], "-D M=4_8: '4_8' is not an integer"),
    (["M=\u0664"], "-D M=\u0664: '\u0664' is not an integer"),  # an Arabic-Indic digit: int() would take it
    (["M=1e3"], "-D M=1e3: '1e3' is not an integer"),
    (["M=--4"], "-D M=--4: '--4' is not an integer"),
    (["M=256", "M=512"], "-D M=512: M is already given (-D M=256)"),
    (["BM=32", "N=64", "BM=32"], "-D BM=32: BM is already given (-D BM=32)"),
])
def test_cli_define_is_plain_digits_once(defines, msg, capsys):
    args = ["check", str(ROOT / "examples" / "ag_gemm.tile")]
    for d in defines:
        args += ["-D", d]
    assert cli_main(args) == 2
    assert capsys.readouterr().err.strip() == msg


def test_cli_define_takes_signed_and_spaced_integers(capsys):
    """What int() took before and a user may write stays accepted: a sign, surrounding spaces."""
    from tilec.cli.args import _dims

    assert _dims(["M=+256", "N= 64 ", "K=-1"]) == {"M": 256, "N": 64, "K": -1}
