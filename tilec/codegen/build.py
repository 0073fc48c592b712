"""Building kernel-IR nodes (kir.py) in the emitters: short constructors, a block builder and placed statements.

`E` makes an operand a node (an int a constant, an identifier a name, a dotted name an attribute, digits a constant);
`add` sums its operands left to right, a sum among them continuing the chain (`add(F, a + b)` is `F + a + b`, as
index arithmetic reads, not `F + (a + b)`), `plus` keeps each operand whole (`F + (a + b)`); `call` is a call of a
kir operation (kir.OPS) or a dotted name; `Block` collects a body's statements with nested blocks opened and closed
the way indentation does. The emitters place a task's statements in order at an indentation (`At`; a `For` or `If`
with an empty body opens a block the statements after it, further in, fill) and `assemble` makes them one body.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from tilec.errors import TilecError

from . import kir as K

Operand = K.Expr | int | float | str


def E(x: Operand) -> K.Expr:
    """An operand as a node: an Expr as is, an int or float a constant, a name (or digits) a Name (a Const)."""
    if isinstance(x, K.Expr):
        return x
    if isinstance(x, bool):
        return K.Const(x)
    if isinstance(x, int):
        return K.const(x)
    if isinstance(x, float):
        return K.Const(x) if x >= 0 or x != x else K.Unary("-", K.Const(-x))
    if isinstance(x, str):
        if x.lstrip("-").isdigit():
            return K.const(int(x))
        parts = x.split(".")
        if all(p.isidentifier() for p in parts):
            out: K.Expr = K.Name(parts[0])
            for p in parts[1:]:
                out = K.Attr(out, p)
            return out
    raise TypeError(f"codegen: {x!r} is not a kernel-IR operand")


def S(text: str) -> K.Const:
    """A string literal (a memory scope)."""
    return K.Const(text)


def _spine(e: K.Expr) -> list[tuple[str, K.Expr]]:
    """(op, term) along the left spine of a + / - chain, the first term's op "+"."""
    out: list[tuple[str, K.Expr]] = []
    while isinstance(e, K.Bin) and e.op in ("+", "-"):
        out.append((e.op, e.right))
        e = e.left
    out.append(("+", e))
    return out[::-1]


def add(*xs: Operand) -> K.Expr:
    """x0 + x1 + ... with every later operand's own sum chain continuing this one (see the module)."""
    if not xs:
        return K.Const(0)
    out = E(xs[0])
    for x in xs[1:]:
        spine = _spine(E(x))
        out = K.Bin("+", out, spine[0][1])
        for op, t in spine[1:]:
            out = K.Bin(op, out, t)
    return out


def plus(*xs: Operand) -> K.Expr:
    """x0 + x1 + ..., each operand whole (a sum among them parenthesized)."""
    out = E(xs[0])
    for x in xs[1:]:
        out = K.Bin("+", out, E(x))
    return out


def conj(xs: list) -> K.Expr | None:
    """x0 & x1 & ... (None for none): a mask of several conditions."""
    if not xs:
        return None
    out = E(xs[0])
    for x in xs[1:]:
        out = K.Bin("&", out, E(x))
    return out


def to(x: Operand, dtype: str) -> K.Call:
    """x.to(dtype)."""
    return K.Call(K.Attr(E(x), "to"), (E(dtype),))


def tup(*xs: Operand) -> K.Tuple:
    """A tuple (a block shape, several results)."""
    return K.Tuple(tuple(E(x) for x in xs))


def bcast(x: Operand, d: int, nd: int) -> K.Expr:
    """x (a vector along dim d) indexed to broadcast over nd dims: x[:, None] and the like."""
    if nd == 1:
        return E(x)
    return K.Index(E(x), tuple(K.Slice() if i == d else K.Const(None) for i in range(nd)))


def sub(a: Operand, b: Operand) -> K.Expr:
    return K.Bin("-", E(a), E(b))


def mul(a: Operand, b: Operand) -> K.Expr:
    return K.Bin("*", E(a), E(b))


def fdiv(a: Operand, b: Operand) -> K.Expr:
    return K.Bin("//", E(a), E(b))


def rank_div(x: Operand, a: int, n: int) -> K.Expr:
    """The r in [0, n) of x = a*r + offset, offset in [0, |a|) (ir/tiling.rank_of): x // a, or where a < 0 (a
    reversed order) n - 1 - (x - a*(n - 1)) // -a, whose dividend is not negative (Triton's // truncates)."""
    if a > 0:
        return fdiv(x, a)
    return sub(n - 1, fdiv(add(x, -a * (n - 1)), -a))


def mod(a: Operand, b: Operand) -> K.Expr:
    return K.Bin("%", E(a), E(b))


def cmp(a: Operand, op: str, b: Operand) -> K.Expr:
    return K.Bin(op, E(a), E(b))


def call(fn: str | K.Expr, *args: Operand, **kw: Operand | None) -> K.Call:
    """fn(*args, **kw); a keyword whose value is None is left out (a load without a mask)."""
    return K.Call(fn, tuple(E(a) for a in args) + tuple(K.Kw(k, E(v)) for k, v in kw.items() if v is not None))


def assign(target: str | K.Expr, value: Operand, comment: str = "") -> K.Assign:
    return K.Assign(E(target), E(value), comment)


def do(e: K.Expr, comment: str = "") -> K.Do:
    return K.Do(e, comment)


@dataclass(frozen=True)
class At:
    """A statement of a task at the indentation its line has (4 spaces a block level)."""

    indent: str
    stmt: K.Stmt


def shifted(item: At, n: int) -> At:
    """An item n columns further in (n < 0: out)."""
    return At(item.indent + " " * n if n >= 0 else item.indent[-n:], item.stmt)


def opens(s: K.Stmt) -> bool:
    """A For or If with an empty body: it opens a block the next statements, further in, fill."""
    return isinstance(s, K.For | K.If) and not s.body and not getattr(s, "orelse", ())


def assemble(items: list[At], indent: int = 0) -> tuple[K.Stmt, ...]:
    """Placed statements (each indented by 4 per block level beyond `indent` spaces) as one body."""
    stack: list[tuple[int, list[K.Stmt], K.Stmt | None]] = [(indent, [], None)]

    def close() -> None:
        _ind, body, head = stack.pop()
        stack[-1][1].append(replace(head, body=tuple(body)))

    for it in items:
        while len(it.indent) < stack[-1][0]:
            close()
        if len(it.indent) != stack[-1][0]:
            raise TilecError(f"codegen: a statement placed at an unexpected indent: {it!r}")
        if opens(it.stmt):
            stack.append((len(it.indent) + 4, [], it.stmt))
        else:
            stack[-1][1].append(it.stmt)
    while len(stack) > 1:
        close()
    return tuple(stack[0][1])


class Block:
    """A body built in order: `add` a statement, `open` a compound one (its body follows until `close`), `done`
    closes what is open and gives the body."""

    def __init__(self) -> None:
        self._stack: list[tuple[list[K.Stmt], Callable[[tuple[K.Stmt, ...]], K.Stmt] | None]] = [([], None)]

    def add(self, *stmts: K.Stmt) -> None:
        self._stack[-1][0].extend(stmts)

    def open(self, make: Callable[[tuple[K.Stmt, ...]], K.Stmt]) -> None:
        self._stack.append(([], make))

    def open_for(self, var: str, start: Operand, stop: Operand, step: Operand | None = None,
                 comment: str = "") -> None:
        self.open(lambda body: K.For(var, E(start), E(stop), None if step is None else E(step), body, comment))

    def open_if(self, cond: K.Expr, comment: str = "") -> None:
        self.open(lambda body: K.If(cond, body, (), comment))

    def close(self) -> None:
        body, make = self._stack.pop()
        assert make is not None
        self.add(make(tuple(body)))

    def done(self) -> tuple[K.Stmt, ...]:
        while len(self._stack) > 1:
            self.close()
        return tuple(self._stack[0][0])
