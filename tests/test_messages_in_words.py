"""Parser and sema messages speak the language, not the grammar: no message names a terminal of tile.lark
(`LSQB`, `DTYPE`, `PEER`, ...). A cheap seeded fuzz over the examples: every prefix of a program (a file cut short
anywhere) and token-level mutations (a token deleted, repeated or replaced), parsed and checked at world 2.
The long front-end fuzzer (tests/test_frontend_fuzz.py) checks locations and crashes; this one the wording."""

from __future__ import annotations

import random
import re

import pytest

from tests._util import ROOT
from tilec.errors import CompileError
from tilec.frontend.parser import _parser, _terminal_words, expected_in_words, parse
from tilec.frontend.sema import check
from tilec.ir.dtypes import DTYPES

TERMINALS = sorted({t.name for t in _parser().terminals} | {"$END"})
SEEDS = ["ag_gemm", "flash_decode", "gemm_rs"]
TOKEN = re.compile(r"[A-Za-z_]\w*(?:@[A-Za-z_]\w*)?|\d+|\s+|.", re.S)
REPLACEMENTS = ["f64", "]", "[", ")", "(", ":", "=", ",", "by", "in", "over", "@", "+", "x", "1", "1.5", "_", "sum",
                "ranks", "symmetric", "barrier", "stage", "\n"]


def _messages(source: str) -> list[str]:
    try:
        check(parse(source, "f.tile"), 2, {})
    except CompileError as e:
        return [d.message for d in e.diagnostics]
    return []


def _token_names(message: str, source: str) -> set[str]:
    """Terminal names in the message, other than names the program itself uses (a tensor may be called `IN`)."""
    words = set(re.findall(r"\$END|[A-Za-z_]\w*", message)) - set(re.findall(r"[A-Za-z_]\w*", source))
    return words & set(TERMINALS)


def _mutants(seed: str, rng: random.Random) -> list[str]:
    text = (ROOT / "examples" / f"{seed}.tile").read_text()
    prefixes = [text[:i] for i in range(1, len(text), max(1, len(text) // 150))]
    toks = TOKEN.findall(text)
    out = []
    for _ in range(60):
        t = list(toks)
        i = rng.randrange(len(t))
        op = rng.randrange(3)
        if op == 0:
            del t[i]
        elif op == 1:
            t.insert(i, t[rng.randrange(len(t))])
        else:
            t[i] = rng.choice(REPLACEMENTS)
        out.append("".join(t))
    return prefixes + out


@pytest.mark.parametrize("seed", SEEDS)
def test_no_message_names_a_grammar_token(seed):
    rng = random.Random(seed)
    seen = 0
    for source in _mutants(seed, rng):
        for m in _messages(source):
            seen += 1
            assert not _token_names(m, source), f"{m!r} names grammar tokens; the program:\n{source}"
    assert seen > 100  # the mutants really were rejected, with messages to read


def test_every_terminal_has_words():
    ignored = set(_parser().ignore_tokens)
    for name in TERMINALS:
        if name not in ignored:
            words = _terminal_words(name)
            assert words != "something else" and not _token_names(words, ""), (name, words)


def test_expected_sets_in_words():
    assert expected_in_words({"COMMA", "RSQB"}) == "`]` or `,`"
    assert expected_in_words({"DTYPE"}) == "a dtype: " + ", ".join(DTYPES)
    assert expected_in_words({"INT", "FLOAT", "NAME", "PEER", "LPAR", "MINUS", "COLON"}) == "`:` or an expression"


@pytest.mark.parametrize("source, phrase", [
    ("program p(world W)\n  in A : f64[4]\n", "unknown dtype 'f64': the dtypes are f16, bf16, f32, i32"),
    ("program p(world W)\n  in A : [4]\n", "expected a dtype: f16, bf16, f32, i32"),
    ("program p(world W)\n  dims M = 4\n  in A : f16[M\n", "expected `]`"),
])
def test_examples_of_the_wording(source, phrase):
    msgs = _messages(source)
    assert any(phrase in m for m in msgs), msgs
