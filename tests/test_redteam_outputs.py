"""Output paths that pass the up-front checks but cannot be written (a read-only folder or file system, a name too
long, a full disk): `compile -o`, `show -o` (text and DOT) and `prog.save` end with one located line and exit code 2,
leave no file and no temporary behind. The temporary file's creation was unguarded: a traceback with exit code 1.
Standard output closed early (a pipe into `head`) or on a full disk: exit 141 quietly / one line and exit 2."""

from __future__ import annotations

import errno
import os
import tempfile

import pytest

import tilec
from tests._util import ROOT
from tilec.cli import main as cli_main
from tilec.fileio import OutputPathError

PROGRAM = str(ROOT / "tests" / "programs" / "chain.tile")
COMMANDS = {"compile": ["compile", PROGRAM, "-w", "2", "-s", "bsp", "-o"],
            "show": ["show", PROGRAM, "-w", "2", "-s", "bsp", "-o"],
            "show-dot": ["show", PROGRAM, "-w", "2", "-s", "bsp", "--format", "dot", "-o"],
            "show-source": ["show", PROGRAM, "-w", "2", "-s", "bsp", "--source", "-o"]}


def _fail_with(code):
    def fail(*_a, **_k):
        raise OSError(code, os.strerror(code))
    return fail


# how the write fails: (name, set-up given monkeypatch and the folder, the output path in it)
def _read_only(mp, d):  # as root a chmod does not stop writes: the folder refuses new files instead
    mp.setattr(tempfile, "mkstemp", _fail_with(errno.EACCES))
    return d / "out.txt"


def _read_only_fs(mp, d):
    mp.setattr(tempfile, "mkstemp", _fail_with(errno.EROFS))
    return d / "out.txt"


def _too_long(mp, d):
    return d / ("n" * 300 + ".txt")


def _disk_full(mp, d):  # the temporary is written, moving it into place fails
    mp.setattr(os, "replace", _fail_with(errno.ENOSPC))
    return d / "out.txt"


FAILURES = {"read-only folder": _read_only, "read-only file system": _read_only_fs, "name too long": _too_long,
            "disk full": _disk_full}
CASES = [(c, f) for c in COMMANDS for f in FAILURES]


@pytest.mark.parametrize("command,failure", CASES, ids=[f"{c}-{f}" for c, f in CASES])
def test_an_unwritable_output_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, command, failure):
    path = FAILURES[failure](monkeypatch, tmp_path)
    rc = cli_main([*COMMANDS[command], str(path)])
    out, err = capsys.readouterr()
    assert rc == 2, (rc, err)
    assert "Traceback" not in err and err.count("\n") == 1 and f"{path}: cannot write here (" in err, err
    assert os.listdir(tmp_path) == []  # neither the file nor a temporary


def test_save_raises_output_path_error(tmp_path, monkeypatch):
    prog = tilec.compile(PROGRAM, world=1, schedule="bsp")
    _read_only(monkeypatch, tmp_path)
    with pytest.raises(OutputPathError, match="cannot write here"):
        prog.save(tmp_path / "x.py")
    assert os.listdir(tmp_path) == []


# -- standard output that goes away or fills up -------------------------------------------------------------------

STDOUT_COMMANDS = {"check": ["check", PROGRAM, "-w", "2"], "compile": ["compile", PROGRAM, "-w", "2", "-s", "bsp"]}


def _tilec(args, **kw):
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "tilec", *args], cwd=ROOT, env=env, stderr=subprocess.PIPE,
                            text=True, **kw)


# one interpreter start each (~3 s): the second program only in the full run
@pytest.mark.parametrize("program", ["tests/programs/chain.tile",
                                     pytest.param("examples/gemm_rs.tile", marks=pytest.mark.slow)])
def test_stdout_closed_early_stops_quietly(program):
    """`tilec check ... | head -1`: exit 141, nothing on stderr (a BrokenPipeError traceback, and `check` first
    reported the broken pipe as a schedule failing in a pass). check flushes each line, so the pipe breaks."""
    import subprocess

    p = _tilec(["check", str(ROOT / program), "-w", "2"], stdout=subprocess.PIPE)
    p.stdout.readline()
    p.stdout.close()
    assert p.wait(timeout=300) == 141
    assert p.stderr.read() == ""


@pytest.mark.parametrize("command", ["check", "compile"])
def test_stdout_on_a_full_disk_is_one_line(command):
    with open("/dev/full", "w") as full:
        p = _tilec(STDOUT_COMMANDS[command], stdout=full)
        err = p.communicate(timeout=300)[1]
    assert p.returncode == 2 and err == "error: cannot write the output: No space left on device\n", err
