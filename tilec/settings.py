"""Every TILEC_* environment variable tilec reads, read here and nowhere else (README.md, "Settings", lists them).

Those that change a compiled program or its launch (fold-last, PDL, the wait sleep, programs per SM, DMA streams,
the wait timeout) are options of `tilec.compile`; their variables only supply the defaults, and the values a
program was compiled with (`Options`) are written into its module's header, so they are part of its cache key and
of `tilec show`'s output. The others set things around a compiled program (the cache folder, the launcher's grace,
a test aid, the bench's cap). A bad value is named on stderr once and the default used: a typo in the environment
never makes `import tilec` end in a traceback; a bad explicit option is an ArgumentError naming it.
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


def _choice(*values: str) -> Callable:
    def parse(raw):
        if raw not in values:
            raise ValueError
        return raw

    return parse


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
    parse: Callable  # raw text (or an option's value) -> value; ValueError if it is not one
    expect: str  # what parse accepts, for the message naming a bad value
    sets: str  # what it sets (the README's table)
    option: str | None = None  # the tilec.compile option whose default it is


SETTINGS = {s.name: s for s in (
    Setting("TILEC_FOLD", True, _switch, "0 or 1 (off or on)",
            "fused-push and specialized end with the fold-last pass (0: left out, an A/B switch)", "fold"),
    Setting("TILEC_PDL", True, _switch, "0 or 1 (off or on)",
            "kernels of a call that run one after another are programmatic dependent launches (sm_90+)", "pdl"),
    Setting("TILEC_WAIT_SLEEP_NS", 0, *_number(0, 10**6, True),
            "nanoseconds a spinning flag wait sleeps between polls on a GPU (0: none)", "wait_sleep_ns"),
    Setting("TILEC_PROGRAMS_PER_SM", 2, *_number(1, 64, True),
            "the most programs of a persistent kernel per SM (fewer where its registers or shared memory do not fit)",
            "programs_per_sm"),
    Setting("TILEC_DMA_STREAMS", 4, *_number(1, 64, True),
            "side streams the copy engines' chunks of a transport=dma stage go out on", "dma_streams"),
    Setting("TILEC_CLAIM", "auto", _auto_switch, "auto, on (1) or off (0)",
            "persistent loops claim their tasks from a counter instead of a fixed stride (auto: under MPS, where a"
            " rank's programs may not all be resident)", "claim"),
    Setting("TILEC_WAIT_TIMEOUT", 60.0, *_number(0, 1e9, False, low_open=True),
            "seconds of wall-clock time one flag wait may take before the call raises WaitTimeout", "wait_timeout"),
    Setting("TILEC_STOP_GRACE", 3.0, *_number(0.01, 3600, False),
            "seconds a rank may stay dead or stopped before `spawn` (and its peers' barriers) give it up"),
    Setting("TILEC_CPU_ADVERSARY", 0.0, *_number(0, 3600, False),
            "CPU emulation: rank e % W starts every kernel of call e this many seconds late (tests of waits)"),
    Setting("TILEC_OP_BARRIER", "auto", _choice("auto", "device"), "auto or device",
            "the entry barrier of `tilec.op` calls: auto (host, a device kernel under capture) or device (always)"),
    Setting("TILEC_MACHINE", None, _text, "a path",
            "the machine file (`tilec calibrate -o FILE`) the cost model and `--schedule auto` rank for (default:"
            " the H200 constants)"),
    Setting("TILEC_CACHE", str(Path.home() / ".cache" / "tilec"), _text, "a path",
            "the folder of generated modules and of `auto`'s choices and measured times"),
    Setting("TILEC_BENCH_MAX_SPLITS", 2048, *_number(0, 2**30, True),
            "`tilec bench`'s cap on a decode row's split count (0: no cap)"),
)}

_WARNED: set[tuple[str, str]] = set()


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
    """What a compiled program was built and is launched with, beyond its program, schedule and tile knobs: each
    a `tilec.compile` option whose default is its TILEC_* variable (SETTINGS)."""

    fold: bool = True
    pdl: bool = True
    wait_sleep_ns: int = 0
    programs_per_sm: int = 2
    dma_streams: int = 4
    wait_timeout: float = 60.0
    claim: str = "auto"
    backend: str = "iris"  # the communication backend of the kernels (BACKENDS); no environment variable
    ranks_per_node: int = 0  # ranks that reach each other by pointer (0: all of them, one node)

    def line(self) -> str:
        """The module header's record of them (one line); backend and ranks_per_node only where not the defaults,
        so programs built without them keep their text."""
        def text(v):
            if isinstance(v, str):
                return v
            return ("on" if v else "off") if isinstance(v, bool) else f"{v:g}"
        shown = [f for f in fields(self) if f.name not in _PLACEMENT or getattr(self, f.name) != f.default]
        return "settings: " + " ".join(f"{f.name}={text(getattr(self, f.name))}" for f in shown)


BACKENDS = ("iris", "nvshmem")  # how kernels reach peers: Iris's heap, or NVSHMEM through torch symmetric memory
_PLACEMENT = ("backend", "ranks_per_node")  # options without a TILEC_* variable


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


OPTION_VARS = {s.option: s.name for s in SETTINGS.values() if s.option}


def options(**given) -> Options:
    """The effective Options: each given value (None: the environment's, else the default), checked; a bad given
    value raises ArgumentError naming the option."""
    out = {opt: option(opt, given.pop(opt, None)) for opt in OPTION_VARS}
    out |= placement(given.pop("backend", None), given.pop("ranks_per_node", None))
    if given:
        raise TypeError(f"unknown options: {', '.join(given)}")
    return Options(**out)


def option(opt: str, v):
    """One option's effective value: `v` checked (ArgumentError naming the option), or None: its variable's."""
    name = OPTION_VARS[opt]
    if v is None:
        return value(name)
    s = SETTINGS[name]
    switch = isinstance(s.default, bool)
    if isinstance(s.default, str):  # a choice: the option takes the same words as the variable
        try:
            return s.parse(v)
        except ValueError:
            raise ArgumentError(f"{opt}={v!r}: expected {s.expect}") from None
    try:  # an option takes a bool or a number as such, not its text (that is the environment's form)
        if isinstance(v, str) or isinstance(v, bool) != switch:
            raise ValueError
        return s.parse(v)
    except (ValueError, TypeError):
        raise ArgumentError(f"{opt}={v!r}: expected {'True or False' if switch else s.expect}") from None
