"""The emitters' lines into the kernel IR (kir.py): the one place where emitted text becomes a tree.

The emitters are moving from Triton lines to kir nodes: flags.py builds its waits, releases and arrivals as nodes
(build.py); the others still write lines. A task's statements are a list of both, a node placed at an indentation
(`At`); each line is read here once, by Python's ast, into kir nodes (device calls of the Iris/Triton spelling
become their kir operations), its indentation giving the block structure, and the nodes join the block their
indentation puts them in. Everything after this (the rewrites, the printers) works on the tree.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from tilec.errors import TilecError

from . import kir as K
from .triton_printer import OP_SPELLING

_CALL_OP = {v: k for k, v in OP_SPELLING.items()}


@dataclass(frozen=True)
class At:
    """A kir statement among a task's emitted lines, at the indentation a line in its place would have."""

    indent: str
    stmt: K.Stmt


Item = str | At


def shifted(item: Item, n: int) -> Item:
    """An item n columns further in (n < 0: out)."""
    if isinstance(item, At):
        return At(item.indent + " " * n if n >= 0 else item.indent[-n:], item.stmt)
    return " " * n + item if n >= 0 else item[-n:]
_BIN = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.BitAnd: "&",
        ast.BitOr: "|"}
_CMP = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_STR = re.compile(r'"([^"\\]*)"')
_FOR = re.compile(r"^for (\w+) in range\((.*)\):$")
_IF = re.compile(r"^(if|elif) (.+):$")


def _dotted(n: ast.AST) -> str | None:
    if isinstance(n, ast.Name):
        return n.id
    if isinstance(n, ast.Attribute):
        base = _dotted(n.value)
        return None if base is None else f"{base}.{n.attr}"
    return None


def expr(n: ast.AST, strings: list[str]) -> K.Expr:
    """A Python expression node as a kir expression."""
    if isinstance(n, ast.Name):
        m = re.fullmatch(r"__tilec_str(\d+)__", n.id)
        return K.Const(strings[int(m.group(1))][1:-1]) if m else K.Name(n.id)
    if isinstance(n, ast.Constant):
        return K.Const(n.value)
    if isinstance(n, ast.BinOp):
        return K.Bin(_BIN[type(n.op)], expr(n.left, strings), expr(n.right, strings))
    if isinstance(n, ast.Compare):
        if len(n.ops) != 1:
            raise TilecError("codegen: a chained comparison in an emitted line")
        return K.Bin(_CMP[type(n.ops[0])], expr(n.left, strings), expr(n.comparators[0], strings))
    if isinstance(n, ast.UnaryOp):
        return K.Unary("-" if isinstance(n.op, ast.USub) else "not", expr(n.operand, strings))
    if isinstance(n, ast.Call):
        name = _dotted(n.func)
        fn: str | K.Expr = _CALL_OP.get(name, name) if name is not None else expr(n.func, strings)
        if isinstance(n.func, ast.Attribute) and name is not None and name not in _CALL_OP and \
                not name.startswith(("tl.", "td.", "iris.", "triton.")):
            fn = expr(n.func, strings)  # a method call: x.to(...)
        args = tuple(expr(a, strings) for a in n.args) + tuple(K.Kw(k.arg, expr(k.value, strings))
                                                              for k in n.keywords)
        return K.Call(fn, args)
    if isinstance(n, ast.Attribute):
        return K.Attr(expr(n.value, strings), n.attr)
    if isinstance(n, ast.Subscript):
        items = n.slice.elts if isinstance(n.slice, ast.Tuple) else [n.slice]
        return K.Index(expr(n.value, strings), tuple(expr(i, strings) for i in items))
    if isinstance(n, ast.Slice):
        return K.Slice()
    if isinstance(n, ast.Tuple):
        return K.Tuple(tuple(expr(i, strings) for i in n.elts))
    raise TilecError(f"codegen: cannot read {ast.dump(n)} of an emitted line")


def _split(line: str) -> tuple[str, str, list[str]]:
    """(code with its string literals hidden, trailing comment, the literals)."""
    strings: list[str] = []

    def hide(m: re.Match) -> str:
        strings.append(m.group(0))
        return f"__tilec_str{len(strings) - 1}__"

    code = _STR.sub(hide, line)
    code, _sep, comment = code.partition("  # ")
    comment = re.sub(r"__tilec_str(\d+)__", lambda m: strings[int(m.group(1))], comment)
    return code, comment, strings


def _stmt(code: str, comment: str, strings: list[str]) -> K.Stmt:
    tree = ast.parse(code).body
    if len(tree) != 1:
        raise TilecError(f"codegen: an emitted line holds {len(tree)} statements: {code}")
    s = tree[0]
    if isinstance(s, ast.Assign) and len(s.targets) == 1:
        return K.Assign(expr(s.targets[0], strings), expr(s.value, strings), comment)
    if isinstance(s, ast.AugAssign):
        return K.AugAssign(expr(s.target, strings), _BIN[type(s.op)], expr(s.value, strings), comment)
    if isinstance(s, ast.Expr):
        return K.Do(expr(s.value, strings), comment)
    raise TilecError(f"codegen: cannot read the emitted line {code!r}")


def lines_to_body(lines: list[Item], indent: int = 0) -> tuple[K.Stmt, ...]:
    """Emitted lines and placed nodes (each indented by 4 per block level beyond `indent` spaces) as a kir body."""
    root: list = []
    # stack of (indent of the block's statements, the list they go to, the open compound statement's builder)
    stack: list[tuple[int, list, dict | None]] = [(indent, root, None)]
    for raw in lines:
        if isinstance(raw, At):
            while len(raw.indent) < stack[-1][0]:
                _close(stack)
            if len(raw.indent) > stack[-1][0]:
                raise TilecError(f"codegen: unexpected indent of an emitted node: {raw!r}")
            stack[-1][1].append(raw.stmt)
            continue
        stripped = raw.lstrip()
        if not stripped:
            continue
        ind = len(raw) - len(stripped)
        while ind < stack[-1][0]:
            _close(stack)
        if ind > stack[-1][0]:
            raise TilecError(f"codegen: unexpected indent in an emitted line: {raw!r}")
        out = stack[-1][1]
        if stripped.startswith("#"):
            out.append(K.Comment(stripped[1:].removeprefix(" ")))
            continue
        code, comment, strings = _split(stripped)
        if m := _FOR.match(code):
            args = [expr(a, strings) for a in ast.parse(f"f({m.group(2)})", mode="eval").body.args]
            start, stop, step = (args + [None])[:3] if len(args) > 1 else (K.Const(0), args[0], None)
            node = {"kind": "for", "var": m.group(1), "start": start, "stop": stop, "step": step, "comment": comment,
                    "body": []}
            out.append(node)
            stack.append((ind + 4, node["body"], node))
        elif m := _IF.match(code):
            cond = expr(ast.parse(m.group(2), mode="eval").body, strings)
            node = {"kind": "if", "cond": cond, "comment": comment, "body": [], "orelse": [], "elif": False,
                    "else_comment": ""}
            if m.group(1) == "elif":
                prev = _last_if(out)
                node["elif"] = True
                prev["orelse"].append(node)
            else:
                out.append(node)
            stack.append((ind + 4, node["body"], node))
        elif code == "else:":
            prev = _last_if(out)
            prev["else_comment"] = comment
            stack.append((ind + 4, prev["orelse"], prev))
        else:
            out.append(_stmt(code, comment, strings))
    while len(stack) > 1:
        _close(stack)
    return _freeze(root)


def _last_if(out: list) -> dict:
    prev = out[-1] if out else None
    if not isinstance(prev, dict) or prev["kind"] != "if":
        raise TilecError("codegen: `elif`/`else` without its `if` in emitted lines")
    while prev["orelse"] and isinstance(prev["orelse"][-1], dict) and prev["orelse"][-1]["elif"]:
        prev = prev["orelse"][-1]
    return prev


def _close(stack: list) -> None:
    stack.pop()


def _freeze(items: list) -> tuple[K.Stmt, ...]:
    out = []
    for it in items:
        if not isinstance(it, dict):
            out.append(it)
        elif it["kind"] == "for":
            out.append(K.For(it["var"], it["start"], it["stop"], it["step"], _freeze(it["body"]), it["comment"]))
        else:
            out.append(K.If(it["cond"], _freeze(it["body"]), _freeze(it["orelse"]), it["comment"],
                            it["else_comment"], it["elif"]))
    return tuple(out)
