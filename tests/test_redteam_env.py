"""Numeric environment knobs (TILEC_STOP_GRACE, TILEC_CPU_ADVERSARY, TILEC_BENCH_MAX_SPLITS): a bad value is named on
stderr and the default used. Some are read when their module is imported, where `int("abc")` made `import tilec`
(and so every `tilec` command) end in a traceback."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest

from tests._util import ROOT
from tilec import settings

# (name, default, low, high, integer) as tilec/settings.py reads them
KNOBS = [("TILEC_STOP_GRACE", 3.0, 0.01, 3600, False), ("TILEC_CPU_ADVERSARY", 0.0, 0, 3600, False),
         ("TILEC_BENCH_MAX_SPLITS", 2048, 0, 2**30, True)]
BAD = ["abc", "-1", "1e999", "nan", "inf", "0x10", "2.5.1", "99999999999"]


@pytest.mark.parametrize("knob,raw", list(itertools.product(KNOBS, BAD)), ids=lambda x: x[0] if isinstance(x, tuple)
                         else x)
def test_a_bad_value_is_named_and_the_default_used(monkeypatch, capsys, knob, raw):
    name, default, low, high, integer = knob
    monkeypatch.setenv(name, raw)
    good = None
    try:
        v = int(raw) if integer else float(raw)
        good = v if low <= v <= high and v == v and abs(v) != float("inf") else None
    except ValueError:
        pass
    got = settings.value(name)
    err = capsys.readouterr().err
    if good is None:
        assert got == default and f"{name}={raw!r}" in err
    else:
        assert got == good and err == ""


def test_unset_and_good_values(monkeypatch):
    for name, default, _low, high, _integer in KNOBS:
        monkeypatch.delenv(name, raising=False)
        assert settings.value(name) == default
        monkeypatch.setenv(name, str(high))
        assert settings.value(name) == high


@pytest.mark.parametrize("raw", ["abc", "-7"])
def test_tilec_imports_with_bad_knobs(raw):
    """Every module that reads a knob at import, in a fresh interpreter with every knob bad: no traceback."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{k[0]: raw for k in KNOBS})
    code = ("import tilec, tilec.device, tilec.runtime.launch, tilec.runtime.dma, tilec.runtime.liveness, tilec.cli,"
            " tilec.perf.bench_decode")
    p = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    for name in ("TILEC_STOP_GRACE", "TILEC_BENCH_MAX_SPLITS"):  # the other: at launch
        assert f"ignoring {name}={raw!r}" in p.stderr, p.stderr
