"""tilec's compile options and the TILEC_* environment variables it reads (README.md lists both).

The options that change a compiled program or its launch (fold-last, PDL, the wait sleep, programs per SM, DMA
streams, claims, the wait timeout) are arguments of `tilec.compile` and flags of the CLI, never environment
variables: a program is what its call says. The values a program was compiled with (`Options`) are written into its
module's header, so they are part of its cache key and of `tilec show`'s output; a bad one is an ArgumentError
naming it. The environment variables, read here and nowhere else, set things around a compiled program (the cache
folder, the launcher's grace, a test aid, the bench's cap, the machine file); a bad value is named on stderr once
and the default used, so a typo in the environment never makes `import tilec` end in a traceback.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from tilec.errors import ArgumentError


def _number(low: float, high: float, integer: bool, low_open: bool = False) -> tuple[Callable, str]:
    kind = "an integer" if integer else "a number"
    top = f"{int(high)}" if high == int(high) else f"{high:g}"  # 1000000000, not 1e+09
    expect = f"{kind} above {low:g}, up to {top}" if low_open else f"{kind} from {low:g} to {top}"

    def parse(raw):
        if isinstance(raw, bool) or (integer and isinstance(raw, float)):
            raise ValueError
        value = int(raw) if integer else float(raw)
        if not (math.isfinite(value) and (low < value if low_open else low <= value) and value <= high):
            raise ValueError
        return value

    return parse, expect


def _switch(raw) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "on", "true", "yes"):
        return True
    if text in ("0", "off", "false", "no"):
        return False
    raise ValueError


def _auto_switch(raw) -> str:
    if isinstance(raw, str) and raw.strip().lower() == "auto":
        return "auto"
    return "on" if _switch(raw) else "off"


def _text(raw):
    if not isinstance(raw, str) or not raw.strip():
        raise ValueError
    return raw


@dataclass(frozen=True)
class Setting:
    name: str  # the environment variable
    default: object
    parse: Callable  # raw text -> value; ValueError if it is not one
    expect: str  # what parse accepts, for the message naming a bad value
    sets: str  # what it sets (the README's table)


@dataclass(frozen=True)
class Option:
    name: str  # the tilec.compile keyword (the CLI flag: --name with dashes)
    default: object
    parse: Callable  # a given value -> value; ValueError if it is not one
    expect: str  # what parse accepts, for the ArgumentError naming a bad value
    sets: str  # what it sets (the README's table)


OPTIONS = {o.name: o for o in (
    Option("fold", True, _switch, "True or False",
           "fused-push and specialized end with the fold-last pass (False: left out, an A/B switch)"),
    Option("pdl", True, _switch, "True or False",
           "kernels of a call that run one after another are programmatic dependent launches (sm_90+)"),
    Option("wait_sleep_ns", 0, *_number(0, 10**6, True),
           "nanoseconds a spinning flag wait sleeps between polls on a GPU (0: none)"),
    Option("programs_per_sm", 2, *_number(1, 64, True),
           "the most programs of a persistent kernel per SM (fewer where its registers or shared memory do not fit)"),
    Option("dma_streams", 4, *_number(1, 64, True),
           "side streams the copy engines' chunks of a transport=dma stage go out on"),
    Option("wait_timeout", 60.0, *_number(0, 1e9, False, low_open=True),
           "seconds of wall-clock time one flag wait may take before the call raises WaitTimeout"),
    Option("claim", "auto", _auto_switch, "auto, on or off",
           "persistent loops claim their tasks from a counter instead of a fixed stride (auto: under MPS, where a"
           " rank's programs may not all be resident)"),
)}

SETTINGS = {s.name: s for s in (
    Setting("TILEC_STOP_GRACE", 3.0, *_number(0.01, 3600, False),
            "seconds a rank may stay dead or stopped before `spawn` (and its peers' barriers) give it up"),
    Setting("TILEC_CPU_ADVERSARY", 0.0, *_number(0, 3600, False),
            "CPU emulation: rank e % W starts every kernel of call e this many seconds late (tests of waits)"),
    Setting("TILEC_MACHINE", None, _text, "a path",
            "the machine file (`tilec calibrate -o FILE`) the cost model and `--schedule auto` rank for (default:"
            " the H200 constants)"),
    Setting("TILEC_CACHE", str(Path.home() / ".cache" / "tilec"), _text, "a path",
            "the folder of generated modules and of `auto`'s choices and measured times"),
    Setting("TILEC_BENCH_MAX_SPLITS", 2048, *_number(0, 2**30, True),
            "`tilec bench`'s cap on a decode row's split count (0: no cap)"),
)}

_WARNED: set[tuple[str, str | None]] = set()  # (variable, bad value), or (variable, None): said once


def value(name: str):
    """The setting's value from the environment (read now), else its default; a bad value is named on stderr (once
    per value) and the default used."""
    s = SETTINGS[name]
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return s.default
    try:
        return s.parse(raw.strip())
    except ValueError:
        if (name, raw) not in _WARNED:
            _WARNED.add((name, raw))
            shown = ("1" if s.default else "0") if isinstance(s.default, bool) else s.default
            sys.stderr.write(f"tilec: ignoring {name}={raw!r}: expected {s.expect}; using {shown}\n")
        return s.default


def env_number(name: str, default: float, *, low: float, high: float = 1e9, integer: bool = False) -> float:
    """A numeric variable outside SETTINGS (the tests' knobs) read the same way: a value that is not a number in
    [low, high] is named on stderr once and the default used."""
    parse, expect = _number(low, high, integer)
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return parse(raw)
    except ValueError:
        if (name, raw) not in _WARNED:
            _WARNED.add((name, raw))
            sys.stderr.write(f"tilec: ignoring {name}={raw!r}: expected {expect}; using {default}\n")
        return default


@dataclass(frozen=True)
class Options:
    """What a compiled program was built and is launched with, beyond its program, schedule and tile knobs: the
    tilec.compile options of OPTIONS, and where its kernels reach peers."""

    fold: bool = True
    pdl: bool = True
    wait_sleep_ns: int = 0
    programs_per_sm: int = 2
    dma_streams: int = 4
    wait_timeout: float = 60.0
    claim: str = "auto"
    backend: str = "iris"  # the communication backend of the kernels (BACKENDS)
    ranks_per_node: int = 0  # ranks that reach each other by pointer (0: all of them, one node)

    def line(self) -> str:
        """The module header's record of them (one line); backend and ranks_per_node only where not the defaults,
        so programs built without them keep their text."""
        shown = [f for f in fields(self) if f.name not in _PLACEMENT or getattr(self, f.name) != f.default]
        return "settings: " + " ".join(f"{f.name}={option_text(getattr(self, f.name))}" for f in shown)


def option_text(v) -> str:
    """An option's value as the header and the command line spell it: on/off, 1.5, auto."""
    if isinstance(v, str):
        return v
    return ("on" if v else "off") if isinstance(v, bool) else f"{v:g}"


BACKENDS = ("iris", "nvshmem")  # how kernels reach peers: Iris's heap, or NVSHMEM through torch symmetric memory
_PLACEMENT = ("backend", "ranks_per_node")  # Options fields that are not in OPTIONS


def placement(backend: str | None, ranks_per_node: int | None) -> dict:
    """backend and ranks_per_node checked alone (ArgumentError naming the option); whether ranks_per_node divides
    the world is tilec.compile's check."""
    backend = "iris" if backend is None else backend
    if backend not in BACKENDS:
        raise ArgumentError(f"backend={backend!r}: expected one of {', '.join(BACKENDS)}")
    rpn = 0 if ranks_per_node is None else ranks_per_node
    if isinstance(rpn, bool) or not isinstance(rpn, int) or rpn < 0:
        raise ArgumentError(f"ranks_per_node={ranks_per_node!r}: expected a positive integer (ranks per node)")
    return {"backend": backend, "ranks_per_node": rpn}


def options(**given) -> Options:
    """The effective Options: each given value (None: its default), checked; a bad given value raises ArgumentError
    naming the option."""
    _say_unread_variables()
    out = {opt: option(opt, given.pop(opt, None)) for opt in OPTIONS}
    out |= placement(given.pop("backend", None), given.pop("ranks_per_node", None))
    if given:
        raise TypeError(f"unknown options: {', '.join(given)}")
    return Options(**out)


def built_with(values: dict | None) -> Options:
    """The Options of programs built with the OPTIONS entries of a dict of tilec.compile keywords (given_options),
    the others at their defaults: what a bench, trial or auto pick keys its measured times and tuned configs by."""
    return options(**given_options(values))


def _say_unread_variables() -> None:
    """A variable named like a compile option (TILEC_FOLD=0 ...) is not read: say so once, so that a run meant with
    the option does not pass silently without it."""
    for opt in OPTIONS:
        name = f"TILEC_{opt.upper()}"
        raw = os.environ.get(name)
        if raw is not None and (name, None) not in _WARNED:
            _WARNED.add((name, None))
            flag = "--" + opt.replace("_", "-")
            sys.stderr.write(f"tilec: {name} is not read: compile options are arguments ({opt}= of tilec.compile,"
                             f" {flag} on the command line)\n")


def given_options(values: dict | None) -> dict:
    """The OPTIONS entries of a dict of tilec.compile keywords that are set (not None): what a bench, trial or auto
    pick passes on to every program it compiles, and keys its measured times by."""
    return {k: v for k, v in (values or {}).items() if k in OPTIONS and v is not None}


def option(opt: str, v):
    """One option's effective value: `v` checked (ArgumentError naming the option), or None: its default."""
    o = OPTIONS[opt]
    if v is None:
        return o.default
    switch = isinstance(o.default, bool)
    if isinstance(o.default, str):  # a choice: auto, on or off (or a bool)
        try:
            return o.parse(v)
        except ValueError:
            raise ArgumentError(f"{opt}={v!r}: expected {o.expect}") from None
    try:  # an option takes a bool or a number as such, not its text
        if isinstance(v, str) or isinstance(v, bool) != switch:
            raise ValueError
        return o.parse(v)
    except (ValueError, TypeError):
        raise ArgumentError(f"{opt}={v!r}: expected {o.expect}") from None
