"""Argument helpers shared by the subcommands (-D NAME=INT, --world, the compile options' flags)."""

from __future__ import annotations

import argparse
import contextlib
import os

from tilec import settings
from tilec.errors import ArgumentError, TilecError


def _dims(items: list[str]) -> dict[str, int]:
    """-D NAME=INT options: plain decimal digits with an optional sign (int() alone also takes '4_8' and non-ASCII
    digits), each name once (a second -D for a name would silently win)."""
    out = {}
    for it in items or []:
        name, eq, val = it.partition("=")
        if not eq or not name.isidentifier():
            raise TilecError(f"-D {it}: expected NAME=INT, e.g. -D M=256")
        digits = val.strip().removeprefix("-").removeprefix("+")
        if not (digits.isascii() and digits.isdigit()):
            raise TilecError(f"-D {it}: '{val}' is not an integer")
        if name in out:
            raise TilecError(f"-D {it}: {name} is already given (-D {name}={out[name]})")
        out[name] = int(val)
    return out


def _world(args) -> int:
    from tilec.frontend.limits import MAX_WORLD

    if args.world is not None:
        if not 1 <= args.world <= MAX_WORLD:
            raise ArgumentError(f"--world {args.world}: must be >= 1 and <= {MAX_WORLD} (tilec's limit)")
        return args.world
    env = os.environ.get("WORLD_SIZE", "1")
    if not env.strip().isdigit() or not 1 <= int(env) <= MAX_WORLD:
        raise ArgumentError(f"WORLD_SIZE={env!r}: must be an integer >= 1 and <= {MAX_WORLD}")
    return int(env)


def _option_flags(g) -> None:
    """The flags of settings.OPTIONS: every command that compiles programs takes them (bench and tune pass them to
    every program they time, and key its measured times by them)."""
    g.add_argument("--fold", choices=("on", "off"), help="fused-push and specialized end with fold-last (on)")
    g.add_argument("--pdl", choices=("on", "off"), help="programmatic dependent launch between kernels (on)")
    g.add_argument("--wait-sleep-ns", type=int, metavar="NS", help="a spinning wait sleeps between polls (0)")
    g.add_argument("--programs-per-sm", type=int, metavar="N", help="most programs of a persistent kernel per SM (2)")
    g.add_argument("--dma-streams", type=int, metavar="N", help="side streams of the copy engines' chunks (4)")
    g.add_argument("--wait-timeout", type=float, metavar="SECONDS", help="one flag wait's limit (60)")
    g.add_argument("--claim", choices=("auto", "on", "off"),
                   help="persistent loops take tasks from a counter (auto: under MPS)")


def _option_values(args) -> dict:
    """The settings.OPTIONS values the command line gave (the others left out: their defaults), checked here: a bad
    one is refused naming its flag's option before any rank starts."""
    switch = {"on": True, "off": False, None: None}
    given = {"fold": switch[getattr(args, "fold", None)], "pdl": switch[getattr(args, "pdl", None)],
             **{k: getattr(args, k, None) for k in ("wait_sleep_ns", "programs_per_sm", "dma_streams", "wait_timeout",
                                                    "claim")}}
    given = settings.given_options(given)
    for opt, v in given.items():
        try:
            settings.option(opt, v)
        except ArgumentError:  # said in the command line's words
            raise ArgumentError(f"--{opt.replace('_', '-')} {settings.option_text(v)}: expected"
                                f" {settings.OPTIONS[opt].expect}") from None
    return given


def transport_arg(text: str) -> str:
    """argparse type of --transport: sm, dma, auto or STAGE=MODE,..."""
    from tilec.passes.transport import parse_transport

    try:
        parse_transport(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _stdout_to_devnull() -> None:
    """Point standard output at the null device: what is left in its buffer is not flushed into a closed pipe or a
    full disk again at exit (an error Python would print as an ignored exception)."""
    import sys

    with contextlib.suppress(OSError):
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)


def _say(text: str) -> None:
    """An error on stderr in one write: ranks under torchrun share the stream, and a line written in pieces (the text,
    then its newline) ran into another rank's."""
    import sys

    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def run_command(args) -> int:
    """Run a parsed subcommand: a TilecError or a rank's runtime error is one line on stderr and its exit code."""
    import errno
    import sys

    try:
        rc = args.fn(args)
        sys.stdout.flush()  # a full disk shows here, not as an exception ignored at exit
        return rc
    except BrokenPipeError:  # stdout closed early (`tilec check ... | head -1`): stop quietly, as a pipe's writer does
        _stdout_to_devnull()
        return 141
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG):
            raise
        _stdout_to_devnull()
        _say(f"error: cannot write the output: {e.strerror}")
        return 2
    except TilecError as e:
        _say(e.render())
        return e.exit_code
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    except Exception as e:  # runtime errors from ranks: one line, no traceback
        from tilec.runtime import TilecRuntimeError

        if isinstance(e, TilecRuntimeError):
            _say(f"error: {e}")
            return 2
        raise
