"""Program paths that are not regular files, and files far past the text limit: one located line and exit code 2,
promptly. A FIFO blocked the open forever (no writer), /dev/zero was read until memory ran out, and a file of
gigabytes was read whole before the length check."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from tilec.cli import main as cli_main
from tilec.frontend.limits import MAX_SOURCE


def _check_soon(args: list[str], capsys) -> tuple[int, str]:
    """`tilec check ARGS` in a thread that must end within 20 s."""
    box: dict = {}
    t = threading.Thread(target=lambda: box.setdefault("rc", cli_main(["check", *args])), daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), f"tilec check {args} still running after 20 s"
    return box["rc"], capsys.readouterr().err


def _fifo(tmp):
    p = tmp / "p.tile"
    os.mkfifo(p)
    return p, "is a FIFO"


def _socket(tmp):
    p = tmp / "s.tile"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(p))
    return p, "is a socket"


SPECIAL = {"fifo": _fifo, "socket": _socket, "dev-zero": lambda tmp: ("/dev/zero", "is a character device"),
           "dev-null": lambda tmp: ("/dev/null", "is a character device"),
           "directory": lambda tmp: (tmp, "Is a directory")}


@pytest.mark.parametrize("kind", SPECIAL)
def test_a_path_that_is_not_a_file_is_one_line(tmp_path, capsys, kind):
    path, why = SPECIAL[kind](tmp_path)
    rc, err = _check_soon([str(path), "--world", "2"], capsys)
    assert rc == 2 and err == f"{path}: error: cannot read program: {why}" + (", not a file" if kind != "directory"
                                                                            else "") + "\n", err


# (name, one line's text, lines): past the limit by bytes or by characters, ASCII or 2-4 byte UTF-8 characters
HUGE = [("ascii-one-line", "# " + "x" * 100, 1), ("ascii-lines", "# comment line", 1),
        ("two-byte", "# " + "\u00e9" * 50, 1), ("four-byte", "# " + "\U0001F600" * 50, 1)]


@pytest.mark.parametrize("size", [MAX_SOURCE + 1, 4 * MAX_SOURCE + 5, 64 * MAX_SOURCE])
@pytest.mark.parametrize("name,line,_n", HUGE, ids=[h[0] for h in HUGE])
def test_a_huge_file_is_one_located_line(tmp_path, capsys, name, line, _n, size):
    path = tmp_path / "big.tile"
    text = (line + "\n") * (size // len(line) + 1)
    path.write_text(text[:size] if name.startswith("ascii") else text)
    rc, err = _check_soon([str(path)], capsys)
    head = err.splitlines()[0]
    assert rc == 2 and "too long (tilec's limit is 65536" in head and "Traceback" not in err, err[:300]
    line_no, col = map(int, head[len(str(path)) + 1:].split(":")[:2])
    lines = text.split("\n")
    assert sum(len(x) + 1 for x in lines[:line_no - 1]) + col - 1 == MAX_SOURCE  # where the limit falls


# -- carets under tab-indented lines ----------------------------------------------------------------------------------

TABBED = [("\t", "\t"), ("\t", "\t\t"), ("  ", "\t"), ("\t", "    "), ("\t", "\t  \t")]


@pytest.mark.parametrize("outer,inner", TABBED, ids=[f"{o!r}-{i!r}" for o, i in TABBED])
@pytest.mark.parametrize("gap", [" ", "\t", " \t "])
def test_the_caret_lines_up_under_tabs(tmp_path, outer, inner, gap):
    """The caret line copies the tabs before the column, so it lines up however wide a terminal draws a tab."""
    from tilec.errors import CompileError
    from tilec.frontend.parser import parse_file
    from tilec.frontend.sema import check

    path = tmp_path / "t.tile"
    path.write_text(f"program p(world W)\n{outer}dims M = 8\n{outer}tiles BM = 8\n{outer}in X : f32[M]\n"
                    f"{outer}out C : f32[M]\n{outer}stage s over m in M by BM:\n{inner}C[m] = X[m] +{gap}Yq[m]\n")
    with pytest.raises(CompileError) as e:
        check(parse_file(path), 1)
    _head, text, caret = str(e.value.render()).split("\n")
    for tab in (4, 8):
        assert caret.expandtabs(tab).index("^") == text.expandtabs(tab).index("Yq[m]"), (tab, text, caret)


@pytest.mark.parametrize("name", ["ag_gemm", "gemm_rs", "flash_decode", "flash_decode_splits"])
def test_a_byte_order_mark_is_not_program_text(name, tmp_path):
    """Some editors write a UTF-8 byte-order mark first: the program is the same, and an error in it is located as
    an editor shows it (the mark takes no column)."""
    from pathlib import Path

    from tilec.errors import CompileError
    from tilec.frontend.parser import parse_file

    src = (Path(__file__).parents[1] / "examples" / f"{name}.tile").read_text()
    plain, marked = tmp_path / "plain.tile", tmp_path / "marked.tile"
    plain.write_text(src)
    marked.write_bytes(b"\xef\xbb\xbf" + src.encode())
    strip = lambda p: repr(p).replace(str(marked), str(plain))  # noqa: E731
    assert strip(parse_file(marked)) == repr(parse_file(plain))
    bad = src.replace("program ", "program 1", 1)
    marked.write_bytes(b"\xef\xbb\xbf" + bad.encode())
    plain.write_text(bad)
    errs = []
    for p in (marked, plain):
        with pytest.raises(CompileError) as e:
            parse_file(p)
        errs.append(str(e.value).replace(str(p), "F"))
    assert errs[0] == errs[1]
