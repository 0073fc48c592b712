"""Names for the emitter's temporaries and small helpers (the emitters build kernel-IR nodes, build.py; index
arithmetic is simplified on that tree, rewrites.py, never on text)."""

from __future__ import annotations

import builtins
import keyword
import re

from tilec.ir.reserved import KERNEL_NAMES

# names a temporary must never take: the kernel's own parameters and locals, the module's globals, Python's names
FIXED_NAMES = KERNEL_NAMES | frozenset(keyword.kwlist) | frozenset(dir(builtins))


class Names:
    """Fresh local names that say what they hold (`a_tile`, `acc`, `b_ptrs`): the first use of a stem gets it
    bare, later ones `_2`, `_3`, ...; never a name in `taken` (parameters, loop variables and their `_r` ranges)."""

    def __init__(self, taken: set[str]):
        self.taken = set(taken) | FIXED_NAMES
        self.used: dict[str, int] = {}

    def new(self, stem: str) -> str:
        stem = re.sub(r"\W", "_", stem)
        n = self.used.get(stem, 0)
        while True:
            n += 1
            name = stem if n == 1 else f"{stem}_{n}"
            if name not in self.taken and not keyword.iskeyword(name):
                break
        self.used[stem] = n
        self.taken.add(name)
        return name


def ident(s: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in s)


def row_major_strides(shape: tuple[int, ...]) -> list[int]:
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= n
    return out[::-1]

