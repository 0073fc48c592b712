"""Python text helpers of the emitter: index arithmetic without no-op terms, names for temporaries, small formatters.

Emitted lines are built as strings from affine pieces, which leaves terms like `x + 0`, `x * 1`, `x // 1`, `(0)`
and `lo + 0 + 64 - 1`. `tidy` parses a finished line with Python's ast, drops those identities, folds adjacent
integer constants and prints it back with only the parentheses it needs: the same computation, written as a person
would.
"""

from __future__ import annotations

import ast
import builtins
import keyword
import re


def _int(n: ast.AST) -> int | None:
    if isinstance(n, ast.Constant) and type(n.value) is int:
        return n.value
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub) and isinstance(n.operand, ast.Constant) and \
            type(n.operand.value) is int:
        return -n.operand.value
    return None


def _const(v: int) -> ast.AST:
    return ast.Constant(v) if v >= 0 else ast.UnaryOp(ast.USub(), ast.Constant(-v))


class _Fold(ast.NodeTransformer):
    """Integer identities only (no reassociation beyond adjacent constants, so no sum changes its order of terms and
    no int32 partial sum can overflow where it did not before)."""

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Add | ast.Sub):
            return self._sum(node)
        left, right = _int(node.left), _int(node.right)
        if isinstance(node.op, ast.Mult):
            if right == 1:
                return node.left
            if left == 1:
                return node.right
            if left is not None and right is not None:
                return _const(left * right)
        if isinstance(node.op, ast.FloorDiv):
            if right == 1:
                return node.left
            if left is not None and right is not None and left >= 0 and right > 0:  # C and Python agree here
                return _const(left // right)
        return node

    @staticmethod
    def _sum(node: ast.BinOp) -> ast.AST:
        terms: list[tuple[int, ast.AST]] = []  # (sign, term) along the left spine of a + / - chain
        while isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
            terms.append((1 if isinstance(node.op, ast.Add) else -1, node.right))
            node = node.left
        terms.append((1, node))
        terms.reverse()
        out: list[tuple[int, ast.AST]] = []
        for sign, t in terms:
            v = _int(t)
            if v is not None:
                if out and _int(out[-1][1]) is not None:  # adjacent constants: one constant
                    prev = out.pop()
                    v = prev[0] * _int(prev[1]) + sign * v
                else:
                    v = sign * v
                if v:
                    out.append((1, _const(v)))
                continue
            out.append((sign, t))
        if not out:
            return ast.Constant(0)
        sign, expr = out[0]
        if sign < 0:
            expr = ast.UnaryOp(ast.USub(), expr)
        for sign, t in out[1:]:
            v = _int(t)
            if v is not None and v < 0:  # x + -3 reads x - 3
                sign, t = -sign, ast.Constant(-v)
            expr = ast.BinOp(expr, ast.Add() if sign > 0 else ast.Sub(), t)
        return expr


_STR = re.compile(r'"([^"\\]*)"')
_FOR = re.compile(r"^for (.+) in (.+):$")
_IF = re.compile(r"^(if|elif) (.+):$")


def _tidy_expr(text: str) -> str:
    return ast.unparse(_Fold().visit(ast.parse(text, mode="eval")))


def tidy(line: str) -> str:
    """One emitted line with its index arithmetic simplified (indent and trailing comment kept)."""
    stripped = line.lstrip()
    if not stripped or stripped.startswith("#"):
        return line
    indent = line[: len(line) - len(stripped)]
    code, sep, comment = stripped.partition("  # ")
    strings: list[str] = []

    def hide(m: re.Match) -> str:  # ast.unparse would requote strings: keep them as written
        strings.append(m.group(0))
        return f"__tilec_str{len(strings) - 1}__"

    code = _STR.sub(hide, code)
    if m := _FOR.match(code):
        code = f"for {m.group(1)} in {_tidy_expr(m.group(2))}:"
    elif m := _IF.match(code):
        code = f"{m.group(1)} {_tidy_expr(m.group(2))}:"
    elif code != "else:":
        code = ast.unparse(_Fold().visit(ast.parse(code)))
    code = re.sub(r"__tilec_str(\d+)__", lambda m: strings[int(m.group(1))], code)
    return indent + code + (sep + comment if sep else "")


# names a temporary must never take: the kernel's own parameters and locals, the module's globals, Python's names
FIXED_NAMES = frozenset({
    "t", "task", "pid", "rank", "epoch", "ERR", "heap_bases", "timeout_ns", "EPOCH_AT", "NPROG", "UPCAST_DOT",
    "GRAPH", "PDL", "CLAIM", "claim", "TIMELINE", "g_size", "g_first", "g_rows", "tl", "triton", "td", "iris", "at",
    "copied", "t_all",
}) | frozenset(keyword.kwlist) | frozenset(dir(builtins))


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


def bcast(e: str, d: int, nd: int) -> str:
    """`e` (a vector along dim d) indexed to broadcast over nd dims."""
    if nd == 1:
        return e
    idx = ", ".join(":" if i == d else "None" for i in range(nd))
    return f"{e}[{idx}]"


def wrap(head: str, items: list[str], tail: str, indent: str, width: int = 120) -> list[str]:
    """`head` + items joined by ", " + `tail` on one line, or broken after commas at `width`, continuation lines
    aligned under the first item."""
    one = head + ", ".join(items) + tail
    if len(one) <= width:
        return [one]
    lines, cur = [], head
    pad = indent + " " * (len(head) - len(indent))
    for i, it in enumerate(items):
        piece = it + (", " if i < len(items) - 1 else tail)
        if len(cur) + len(piece.rstrip()) > width and cur.strip() != head.strip():
            lines.append(cur.rstrip())
            cur = pad
        cur += piece
    lines.append(cur)
    return lines
