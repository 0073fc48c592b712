"""Parser and semantic errors: `CompileError.render()` (file:line:col, the source line, a caret) against goldens.

The malformed programs are tests/programs/errors/*.tile (syntax_*: the parser, sema_*: the semantic checks); a
`# world: N` line picks the world size (default 2). Besides the goldens, each case names the phrase its message
must contain, so a careless --update-golden cannot bless a wrong diagnostic.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import tilec
from tests._util import PROGRAMS, ROOT
from tilec.cli import main as cli_main
from tilec.errors import CompileError, Diagnostic, Loc
from tilec.frontend.parser import parse

ERRORS = PROGRAMS / "errors"

EXPECT = {
    "syntax_missing_world": ["3:3:", "unexpected 'dims'", "(world W)"],
    "syntax_world_keyword": ["2:13:", "unexpected 'W'", "(world W)"],
    "syntax_tile_loop_without_by": ["unexpected ','", "a tile loop is `VAR in EXTENT by TILE`"],
    "syntax_tile_loop_without_in": ["unexpected 'by'", "IN"],
    "syntax_stage_without_over": ["unexpected ':'", "OVER"],
    "syntax_missing_body": ["unexpected 'stage'"],
    "syntax_missing_body_eof": ["unexpected end of file", "a stage body is one or more assignments"],
    "syntax_tensor_decl_colon": ["unexpected 'f16'", "tensor declarations look like"],
    "syntax_tensor_decl_dtype": ["unexpected 'f64'", "DTYPE"],
    "syntax_tensor_decl_no_dtype": ["unexpected '['", "DTYPE"],
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


def test_world_must_be_positive(example_source):
    with pytest.raises(CompileError, match="world size must be >= 1, got 0"):
        tilec.compile("examples/ag_gemm.tile", world=0, source=example_source)


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
    assert cli_main(["check", str(ROOT / "examples" / "ag_gemm.tile"), "--world", "0"]) == 2
    assert "--world 0: must be >= 1" in capsys.readouterr().err
