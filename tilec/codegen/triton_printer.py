"""The Iris/Triton printer of the kernel IR (kir.py): a table of how each device operation is spelled, and Python
text with only the parentheses it needs. Another backend is another printer: its own OP_SPELLING over the same tree.
"""

from __future__ import annotations

from . import kir as K

# kir operation -> the call that performs it here (tilec.device holds the td.* helpers; iris translates addresses)
OP_SPELLING = {
    "load": "tl.load",
    "store": "tl.store",
    "remote_load": "iris.load",
    "peer_offset": "td.peer_offset",
    "wait": "td.wait",
    "wait_all": "td.wait_all",
    "release": "td.release",
    "arrive": "td.arrive",
    "arrive_left": "td.arrive_left",
    "dot": "td.dot",
    "enter": "td.enter",
    "leave": "td.leave",
    "clock": "td.clock",
    "mark": "td.mark",
}
assert set(OP_SPELLING) == set(K.OPS)

WIDTH = 120

# binding strength, as Python's grammar has it (ast.unparse's order): higher binds tighter
_TUPLE, _TEST, _NOT, _CMP, _EXPR, _BOR, _BAND, _ARITH, _TERM, _FACTOR, _ATOM = range(11)
_PREC = {"|": _BOR, "&": _BAND, "+": _ARITH, "-": _ARITH, "*": _TERM, "/": _TERM, "//": _TERM, "%": _TERM}
for _c in ("<", "<=", ">", ">=", "==", "!="):
    _PREC[_c] = _CMP


def expr(e: K.Expr, ctx: int = _TEST) -> str:
    """e as Python text, parenthesized where a context of binding strength ctx needs it."""
    if isinstance(e, K.Name):
        return e.id
    if isinstance(e, K.Const):
        if isinstance(e.value, str):
            return f'"{e.value}"'
        return repr(e.value)
    if isinstance(e, K.Bin):
        p = _PREC[e.op]
        if p == _CMP:  # comparisons do not chain here: both sides bind tighter
            text = f"{expr(e.left, _EXPR)} {e.op} {expr(e.right, _EXPR)}"
        else:
            text = f"{expr(e.left, p)} {e.op} {expr(e.right, p + 1)}"
        return f"({text})" if ctx > p else text
    if isinstance(e, K.Unary):
        if e.op == "not":
            text = f"not {expr(e.operand, _NOT)}"
            return f"({text})" if ctx > _NOT else text
        text = f"-{expr(e.operand, _FACTOR)}"
        return f"({text})" if ctx > _FACTOR else text
    if isinstance(e, K.Kw):
        return f"{e.name}={expr(e.value)}"
    if isinstance(e, K.Call):
        return f"{callee(e)}({', '.join(expr(a) for a in e.args)})"
    if isinstance(e, K.Attr):
        return f"{expr(e.value, _ATOM)}.{e.attr}"
    if isinstance(e, K.Index):
        return f"{expr(e.value, _ATOM)}[{', '.join(expr(i) for i in e.items)}]"
    if isinstance(e, K.Slice):
        return ":"
    if isinstance(e, K.Tuple):
        inner = ", ".join(expr(i) for i in e.items) + ("," if len(e.items) == 1 else "")
        return f"({inner})" if ctx > _TUPLE or not e.items else inner
    raise TypeError(f"no spelling for {e!r}")


def callee(c: K.Call) -> str:
    if isinstance(c.fn, str):
        return OP_SPELLING.get(c.fn, c.fn)
    return expr(c.fn, _ATOM)


def wrap(head: str, items: list[str], tail: str, indent: str, width: int = WIDTH) -> list[str]:
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


class Printer:
    """Statements as lines. wrap: the calls whose lines are broken at WIDTH (None: every line that is too long)."""

    def __init__(self, wrap_calls: frozenset[str] | None = None):
        self.wrap_calls = wrap_calls

    def prepare(self, kern: K.Kernel) -> K.Kernel:
        """The kernel as this backend's op table spells it, before it is simplified (Iris: as built)."""
        return kern

    def body(self, body: tuple[K.Stmt, ...], indent: str) -> list[str]:
        out: list[str] = []
        for s in body:
            out += self.stmt(s, indent)
        return out

    def stmt(self, s: K.Stmt, ind: str) -> list[str]:
        if isinstance(s, K.Comment):  # cut where it would pass the width
            line = f"{ind}# {s.text}"
            return [line if len(line) <= WIDTH else line[: WIDTH - 3] + "..."]
        if isinstance(s, K.For) and s.claim is not None:  # tilec.device.first_task: a stride, or claimed tasks
            step = expr(s.step) if s.step is not None else "1"
            return [f"{ind}claim = {expr(s.claim)}  # this kernel's task counter (read where CLAIM)",
                    f"{ind}{s.var} = td.first_task({expr(s.start)}, claim, CLAIM)",
                    f"{ind}while {s.var} < {expr(s.stop)}:{_tail(s.comment)}",
                    *self.body(s.body, ind + "    "),
                    f"{ind}    {s.var} = td.next_task({s.var}, claim, {step}, CLAIM)",
                    f"{ind}td.claims_done(claim, {step}, CLAIM)"]
        if isinstance(s, K.For):
            rng = [expr(s.start), expr(s.stop)] + ([expr(s.step)] if s.step is not None else [])
            if s.ordered:  # its waits order its loads: not software-pipelined (rewrites.order_waits)
                return [f"{ind}# one stage: a pipelined loop would issue later iterations' loads before their waits",
                        f"{ind}for {s.var} in tl.range({', '.join(rng)}, num_stages=1):{_tail(s.comment)}",
                        *self.body(s.body, ind + "    ")]
            return [f"{ind}for {s.var} in range({', '.join(rng)}):{_tail(s.comment)}",
                    *self.body(s.body, ind + "    ")]
        if isinstance(s, K.If):
            return self._if(s, ind, "if")
        if isinstance(s, K.Assign):
            head = f"{expr(s.target, _TUPLE)} = "
            return self._line(ind, head, s.value, s.comment)
        if isinstance(s, K.AugAssign):
            return self._line(ind, f"{s.target.id} {s.op}= ", s.value, s.comment)
        if isinstance(s, K.Do):
            return self._line(ind, "", s.expr, s.comment)
        raise TypeError(f"no spelling for {s!r}")

    def _if(self, s: K.If, ind: str, word: str) -> list[str]:
        out = [f"{ind}{word} {expr(s.cond)}:{_tail(s.comment)}", *self.body(s.body, ind + "    ")]
        if len(s.orelse) == 1 and isinstance(s.orelse[0], K.If) and s.orelse[0].elif_:
            return out + self._if(s.orelse[0], ind, "elif")
        if s.orelse:
            out += [f"{ind}else:{_tail(s.else_comment)}", *self.body(s.orelse, ind + "    ")]
        return out

    def _line(self, ind: str, head: str, value: K.Expr, comment: str) -> list[str]:
        one = f"{ind}{head}{expr(value)}{_tail(comment)}"
        if len(one) > WIDTH and self.wrap_calls is None and isinstance(value, K.Bin) and value.op in ("+", "-"):
            return _wrapped_sum(f"{ind}{head}(", value, f"){_tail(comment)}")  # broken inside parentheses
        if len(one) <= WIDTH or not isinstance(value, K.Call) or not self._wraps(value):
            return [one]
        return self._wrapped(f"{ind}{head}", value, f"){_tail(comment)}", ind)

    def _wraps(self, c: K.Call) -> bool:
        return self.wrap_calls is None or (isinstance(c.fn, str) and c.fn in self.wrap_calls)

    def _wrapped(self, head: str, c: K.Call, tail: str, ind: str) -> list[str]:
        """A call broken after its commas; an argument that is itself a too long call is broken inside."""
        head = f"{head}{callee(c)}("
        lines = wrap(head, [expr(a) for a in c.args], tail, ind)
        if self.wrap_calls is not None or all(len(ln) <= WIDTH for ln in lines):
            return lines
        pad = " " * len(head)
        out, cur = [], head
        for i, a in enumerate(c.args):
            end = ", " if i < len(c.args) - 1 else tail
            text = expr(a)
            if len(cur) + len(text) + len(end.rstrip()) <= WIDTH:
                cur += text + end
                continue
            if cur.strip() != head.strip():
                out.append(cur.rstrip())
                cur = pad
            inner = a.value if isinstance(a, K.Kw) else a
            kw = f"{a.name}=" if isinstance(a, K.Kw) else ""
            sub = None
            if len(cur) + len(text) + len(end.rstrip()) > WIDTH:
                if isinstance(inner, K.Call) and inner.args:
                    sub = self._wrapped(cur + kw, inner, ")" + end.rstrip(), pad)
                elif isinstance(inner, K.Bin) and inner.op in ("+", "-", "&", "|"):
                    sub = _wrapped_sum(cur + kw, inner, end.rstrip())
            if sub is not None:
                out += sub[:-1]
                cur = sub[-1] + (" " if end.endswith(" ") else "")
            else:
                cur += text + end
        out.append(cur.rstrip() if cur.endswith(" ") else cur)
        return out

    def signature(self, fn: K.Fn) -> list[str]:
        params = [(f"{p.name}: tl.constexpr" if p.constexpr else p.name) + (f" = {p.default}" if p.default else "")
                  for p in fn.params]
        return wrap(f"def {fn.name}(", params, "):", "")


def _wrapped_sum(head: str, e: K.Bin, tail: str) -> list[str]:
    """A sum (or a chain of `&`) inside parentheses broken before its terms at WIDTH, continued under the first."""
    p = _PREC[e.op]
    terms: list[tuple[str, K.Expr]] = []
    while isinstance(e, K.Bin) and _PREC[e.op] == p:
        terms.append((e.op, e.right))
        e = e.left
    terms.append(("", e))
    terms.reverse()
    pieces = [expr(terms[0][1], p)] + [f"{op} {expr(t, p + 1)}" for op, t in terms[1:]]
    pad = " " * len(head)
    out, cur = [], head + pieces[0]
    for i, p in enumerate(pieces[1:], 1):
        end = tail if i == len(pieces) - 1 else ""
        if len(cur) + 1 + len(p) + len(end) > WIDTH:
            out.append(cur)
            cur = pad + p
        else:
            cur += " " + p
    out.append(cur + tail)
    return out


def _tail(comment: str) -> str:
    return f"  # {comment}" if comment else ""
