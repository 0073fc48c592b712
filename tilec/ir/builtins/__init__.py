"""Tile-library functions: one module each holding its TileFn (shape rule, torch reference, device call, data
movement); the device functions themselves are in tilec/device.py. A new builtin is a module here and a line in
TILE_FNS (plus its @triton.jit code in tilec/device.py)."""

from .attend import ATTEND
from .base import TileFn
from .lse_merge import LSE_MERGE

TILE_FNS: dict[str, TileFn] = {f.name: f for f in (ATTEND, LSE_MERGE)}

__all__ = ["TILE_FNS", "TileFn"]
