"""Argument helpers shared by the subcommands (-D NAME=INT, --world)."""

from __future__ import annotations

import os

from tilec.errors import TilecError


def _dims(items: list[str]) -> dict[str, int]:
    out = {}
    for it in items or []:
        name, eq, val = it.partition("=")
        if not eq or not name.isidentifier():
            raise TilecError(f"-D {it}: expected NAME=INT, e.g. -D M=256")
        try:
            out[name] = int(val)
        except ValueError:
            raise TilecError(f"-D {it}: '{val}' is not an integer") from None
    return out


def _world(args) -> int:
    if args.world is not None:
        if args.world < 1:
            raise TilecError(f"--world {args.world}: must be >= 1")
        return args.world
    return int(os.environ.get("WORLD_SIZE", "1"))
