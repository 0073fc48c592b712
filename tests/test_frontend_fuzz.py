"""A seeded mutation fuzzer of the front end: no input makes tilec raise anything but a located TilecError.

Seeds are the example programs and tests/programs/*.tile. Each mutant (bytes flipped, inserted or deleted, invalid
UTF-8, tokens swapped, deleted, duplicated or replaced, numbers made huge or negative, expressions nested deep or
summed long) is written to a file and compiled through the whole pipeline (parse, sema, lower, every schedule's
passes and codegen). Every outcome must be: compiled (and the generated module is valid Python), or a TilecError
whose every diagnostic names `file:line:col` inside the file (ScheduleError / VerifyError: a schedule that does
not apply). The CLI path (`tilec check`) must exit 2 with located lines and no traceback.

The default run is short; `pytest -m fuzz_long tests/test_frontend_fuzz.py` runs the long one
(TILEC_FUZZ_MUTANTS mutants, default 20000; TILEC_FUZZ_SEED picks another sequence).
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import tilec
from tilec.cli import main as cli_main
from tilec.errors import CompileError, ScheduleError, TilecError, VerifyError
from tilec.passes.schedules import SCHEDULES

ROOT = Path(__file__).resolve().parents[1]
SEEDS = sorted((ROOT / "examples").glob("*.tile")) + sorted((ROOT / "tests" / "programs").glob("*.tile"))
WORLDS = (1, 2, 3, 4)

# A token of the .tile language (or one stray character): the unit of token-level mutations.
TOKEN = re.compile(r"[A-Za-z_]\w*(?:@[A-Za-z_]\w*)?|\d+\.\d*(?:[eE][-+]?\d+)?|\d+|#[^\n]*|\s+|.", re.S)
# Sizes are small or past the limits: legal sizes of millions of tiles compile, but slowly (the verifier walks
# every tile of a loop in Python), which is no front-end bug and would only slow the run.
NUMBERS = ["0", "1", "2", "3", "7", "24", "48", "63", "65", "-1", "-64", "1024", "65536", str(2**31 - 1), str(2**31),
           str(2**32), str(2**40), str(2**40 + 1), str(2**63), str(2**64),
           "1" + "0" * 30, "9" * 5000, "1.5", "0.0", "1e999", "1e-999", "00", "0064"]
WORDS = ["program", "world", "dims", "tiles", "in", "out", "buf", "stage", "over", "by", "ranks", "barrier", "sum",
         "symmetric", "rank", "f16", "bf16", "f32", "i32", "f64", "exp", "attend", "lse_merge", "max", "relu", "_",
         "W", "M", "N", "K", "BM", "BK", "A", "B", "C", "Q", "r", "m", "k", "n"]
PUNCT = list("()[],:=+-*/%@#.;{}\\\"'$!?<>&|^~`") + ["\n", "\t", " ", "\r", "\x00", "\u00e9", "\u2028", "\ufeff"]
BAD_UTF8 = [b"\xff", b"\xfe", b"\x80", b"\xc3", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
            b"\xc0\xaf"]
EXPR_RHS = re.compile(r"(?m)^(\s+[^#\n]*\S\]\s*=\s*)([^\n#]+?)(\s*(?:#[^\n]*)?)$")  # `X[...] = expr` lines


# -- mutators: bytes -> bytes ---------------------------------------------------------------------------------------


def _tokens(data: bytes) -> list[str]:
    return TOKEN.findall(data.decode("utf-8", "surrogateescape"))


def _join(toks: list[str]) -> bytes:
    return "".join(toks).encode("utf-8", "surrogateescape")


def byte_mutation(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 2, 4))):
        i = rng.randrange(len(b) + 1)
        op = rng.randrange(5)
        if op == 0 and i < len(b):
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i:i] = bytes([rng.randrange(256)])
        elif op == 2:
            del b[i:i + rng.choice((1, 1, 2, 8))]
        elif op == 3:
            b[i:i] = rng.choice(BAD_UTF8)
        else:
            b[i:i] = rng.choice(PUNCT).encode()
    return bytes(b)


def token_mutation(rng: random.Random, data: bytes) -> bytes:
    toks = _tokens(data)
    solid = [i for i, t in enumerate(toks) if not t.isspace()]
    if not solid:
        return data
    for _ in range(rng.choice((1, 1, 2, 3))):
        i = rng.choice(solid)
        op = rng.randrange(7)
        if op == 0:  # swap with another token
            j = rng.choice(solid)
            toks[i], toks[j] = toks[j], toks[i]
        elif op == 1:
            toks[i] = ""
        elif op == 2:
            toks[i] = toks[i] + " " + toks[i]
        elif op == 3:  # an identifier of the program, or a keyword
            names = [t for t in toks if t[:1].isalpha() or t[:1] == "_"]
            toks[i] = rng.choice(names + WORDS)
        elif op == 4:  # a number: the program's own or an interesting one (huge, negative, fractional)
            nums = [j for j in solid if toks[j].isdigit()]
            toks[rng.choice(nums) if nums else i] = rng.choice(NUMBERS)
        elif op == 5:
            toks[i] = rng.choice(PUNCT)
        else:  # a negated number or name
            toks[i] = "-" + toks[i]
    return _join(toks)


def _deep(rng: random.Random, e: str, n: int) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return "(" * n + e + ")" * n
    if kind == 1:
        return "-" * n + "(" + e + ")"
    if kind == 2:
        return " + ".join([e] * n)
    if kind == 3:
        return rng.choice(("exp(", "relu(", "max(0.0, ", "f32(")) * n + e + ")" * n
    if kind == 4:
        return "(" + e + ")" + " * 1.0" * n
    return "1.0 * (" * n + e + ")" * n  # a right-deep chain of products


def nesting_mutation(rng: random.Random, data: bytes) -> bytes:
    text = data.decode("utf-8", "surrogateescape")
    sites = list(EXPR_RHS.finditer(text))
    n = rng.choice((2, 10, 40, 63, 64, 65, 100, 120, 300, 1000, 5000))
    if not sites or rng.random() < 0.2:  # deep nesting in an index or a shape instead
        ms = list(re.finditer(r"\[([^\[\]\n]+)\]", text))
        if not ms:
            return data
        m = rng.choice(ms)
        inner = m.group(1).split(",")
        j = rng.randrange(len(inner))
        inner[j] = "(" * n + inner[j].strip() + ")" * n if rng.random() < 0.5 else " + ".join([inner[j].strip()]
                                                                                               + ["0"] * n)
        return (text[:m.start(1)] + ",".join(inner) + text[m.end(1):]).encode("utf-8", "surrogateescape")
    m = rng.choice(sites)
    return (text[:m.start(2)] + _deep(rng, m.group(2), n) + text[m.end(2):]).encode("utf-8", "surrogateescape")


MUTATORS = (byte_mutation, token_mutation, token_mutation, nesting_mutation)


def mutants(seed: int, count: int) -> Iterator[tuple[str, bytes, int]]:
    """(label, mutant bytes, world) for `count` mutants, the same for the same seed."""
    rng = random.Random(seed)
    sources = [(p.stem, p.read_bytes()) for p in SEEDS]
    for i in range(count):
        stem, data = rng.choice(sources)
        mutate = MUTATORS[i % len(MUTATORS)]
        data = mutate(rng, data)
        if rng.random() < 0.25:  # and a second, smaller mutation (nesting twice could multiply into megabytes)
            data = rng.choice((byte_mutation, token_mutation))(rng, data)
        yield f"{i}-{stem}-{mutate.__name__}", data, rng.choice(WORLDS)


# -- the oracle -----------------------------------------------------------------------------------------------------


def assert_located(e: TilecError, path: str, data: bytes) -> None:
    """Every diagnostic of a CompileError points inside the file (line, column) and renders with its caret."""
    if not isinstance(e, CompileError):
        assert isinstance(e, ScheduleError | VerifyError), f"{type(e).__name__}: {e}"
        return
    lines = data.decode("utf-8", "replace").split("\n")  # as the parser counts lines
    assert e.diagnostics
    text = e.render()
    for d in e.diagnostics:
        assert d.loc.file == path, d
        assert 1 <= d.loc.line <= len(lines) and d.loc.col >= 1, f"{d.loc}: {d.message}"
        assert f"{path}:{d.loc.line}:{d.loc.col}: error: " in text
        assert "\n" not in d.message, d.message
    assert str(e).count("\n") == len(e.diagnostics) - 1  # one line per diagnostic


def compile_all(path: Path, data: bytes, world: int) -> list[str]:
    """Compile the file under every schedule; return the outcomes. Anything but a TilecError propagates."""
    outcomes = []
    for s in SCHEDULES:
        try:
            prog = tilec.compile(path, world=world, schedule=s)
        except TilecError as e:
            assert_located(e, str(path), data)
            outcomes.append(type(e).__name__)
            if isinstance(e, CompileError):  # parse and sema errors are the same under every schedule
                break
            continue
        compile(prog.source, f"<{s}>", "exec")  # the generated module is valid Python
        outcomes.append("ok")
    return outcomes


def run_fuzz(tmp_path: Path, seed: int, count: int) -> dict[str, int]:
    stats: dict[str, int] = {}
    path = tmp_path / "mutant.tile"
    for label, data, world in mutants(seed, count):
        path.write_bytes(data)
        try:
            outcomes = compile_all(path, data, world)
        except Exception as e:  # a Python exception is a front-end bug: keep the mutant for the report
            keep = tmp_path / f"crash-{label}.tile"
            keep.write_bytes(data)
            raise AssertionError(f"mutant {label} (world {world}, saved as {keep}) raised {type(e).__name__}: {e}") \
                from e
        for o in outcomes:
            stats[o] = stats.get(o, 0) + 1
    return stats


# -- tests ----------------------------------------------------------------------------------------------------------


def test_mutants_are_deterministic():
    a = [(lbl, d) for lbl, d, _ in mutants(7, 40)]
    assert a == [(lbl, d) for lbl, d, _ in mutants(7, 40)]
    assert len({d for _, d in a}) > 30  # and varied


def test_fuzz_short(tmp_path):
    stats = run_fuzz(tmp_path, seed=int(os.environ.get("TILEC_FUZZ_SEED", "16")), count=400)
    # the fuzzer reaches every outcome, not just the parser's errors
    assert stats.get("CompileError", 0) > 100 and stats.get("ok", 0) > 20, stats


@pytest.mark.slow
@pytest.mark.fuzz_long
def test_fuzz_long(tmp_path):
    count = int(os.environ.get("TILEC_FUZZ_MUTANTS", "20000"))
    run_fuzz(tmp_path, seed=int(os.environ.get("TILEC_FUZZ_SEED", "1016")), count=count)


@pytest.mark.parametrize("i", range(12))
def test_cli_check_on_mutants(tmp_path, capsys, i):
    """`tilec check` on a mutant that does not compile: exit 2, every stderr line located, no traceback."""
    rng = random.Random(100 + i)
    for label, data, world in mutants(1000 + i, 50):
        path = tmp_path / f"m{i}.tile"
        path.write_bytes(data)
        try:
            tilec.compile(path, world=world, schedule="bsp")
            continue
        except CompileError:
            pass
        rc = cli_main(["check", str(path), "--world", str(world)])
        out, err = capsys.readouterr()
        assert rc == 2 and out == "", (label, rc, out, err)
        assert "Traceback" not in err
        heads = [ln for ln in err.splitlines() if ": error: " in ln]
        assert heads and all(re.match(rf"{re.escape(str(path))}:\d+:\d+: error: ", h) for h in heads), err
        if rng.random() < 0.5:
            return
    pytest.fail("no mutant failed to compile")
