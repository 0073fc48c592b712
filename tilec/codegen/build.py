"""Building kernel-IR nodes (kir.py) in the emitters: short constructors and a block builder.

`E` makes an operand a node (an int a constant, an identifier a name, "0"-like digits a constant); `add` sums its
operands left to right, a sum among them continuing the chain (`add(F, a + b)` is `F + a + b`, as index arithmetic
reads, not `F + (a + b)`); `call` is a call of a kir operation (kir.OPS) or a dotted name; `Block` collects a
body's statements with nested blocks opened and closed the way indentation does.
"""

from __future__ import annotations

from collections.abc import Callable

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
        return K.Const(x)
    if isinstance(x, str):
        if x.lstrip("-").isdigit():
            return K.const(int(x))
        if all(p.isidentifier() for p in x.split(".")):
            return K.Name(x)
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


def sub(a: Operand, b: Operand) -> K.Expr:
    return K.Bin("-", E(a), E(b))


def mul(a: Operand, b: Operand) -> K.Expr:
    return K.Bin("*", E(a), E(b))


def fdiv(a: Operand, b: Operand) -> K.Expr:
    return K.Bin("//", E(a), E(b))


def mod(a: Operand, b: Operand) -> K.Expr:
    return K.Bin("%", E(a), E(b))


def cmp(a: Operand, op: str, b: Operand) -> K.Expr:
    return K.Bin(op, E(a), E(b))


def call(fn: str | K.Expr, *args: Operand, **kw: Operand) -> K.Call:
    return K.Call(fn, tuple(E(a) for a in args) + tuple(K.Kw(k, E(v)) for k, v in kw.items()))


def assign(target: str | K.Expr, value: Operand, comment: str = "") -> K.Assign:
    return K.Assign(E(target), E(value), comment)


def do(e: K.Expr, comment: str = "") -> K.Do:
    return K.Do(e, comment)


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
