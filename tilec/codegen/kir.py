"""The kernel IR: one generated module's kernels as a small typed tree, which rewrites simplify and printers print.

A backend is a printer of this tree (`triton_printer.py` prints Iris/Triton). Nothing here names a backend's
spelling: device operations are `Call` nodes whose `fn` is an operation of `OPS` (a tile load, a remote store's
peer offset, a flag wait or release, a dot, ...), which each printer maps to its own call through an op table;
any other call (`tl.arange`, `tl.where`, a task function) is a `Call` of a plain dotted name that the printer
writes as is.

    Module     the kernels of one module
    Kernel     a persistent kernel: its entry `Fn` (the loop over tasks) and one task `Fn` per stage it calls
    Fn         name, parameters, body
    statements Comment | Assign | AugAssign | Do (an expression for its effect) | For (a `range` loop) | If
    expressions Name | Const | Bin | Unary | Call | Attr | Index | Slice | Tuple | Kw (a keyword argument)

Every node is a frozen dataclass; a rewrite returns new nodes (`rewrites.py`), so each is tested on its own on a
hand-written tree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

# device operations of a kernel: what the tree says, independent of how a backend spells it
OPS = (
    "load",  # a tile load from this rank's memory (or a peer's, through a peer offset added to the pointer)
    "store",  # a tile store
    "remote_load",  # a load whose rows may lie on different ranks: each address translated to its owner
    "peer_offset",  # the element offset from this rank's copy of a symmetric buffer to a peer's
    "wait",  # spin until a flag counter reaches its target
    "wait_all",  # spin until a block of flag counters reaches its target
    "release",  # bump a flag counter after the task's stores (release order)
    "arrive",  # bump a group's arrival counter; true for the arrival that completes the group
    "arrive_left",  # bump a group's arrival counter; the arrivals still to come
    "dot",  # a tile matrix product, accumulated
    "enter",  # a kernel's start: the call's epoch
    "leave",  # a kernel's end
    "clock",  # a timestamp (timeline builds)
    "mark",  # a timeline record
)


# -- expressions -------------------------------------------------------------------------------------------
class Expr:
    __slots__ = ()


@dataclass(frozen=True)
class Name(Expr):
    id: str


@dataclass(frozen=True)
class Const(Expr):
    value: int | float | bool | str | None


@dataclass(frozen=True)
class Bin(Expr):
    """A binary operation: arithmetic (+ - * / // %), bitwise (& |) or a comparison (< <= > >= == !=)."""

    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Unary(Expr):
    op: str  # "-" or "not"
    operand: Expr


@dataclass(frozen=True)
class Kw(Expr):
    """A keyword argument of a call."""

    name: str
    value: Expr


@dataclass(frozen=True)
class Call(Expr):
    """fn: an operation of OPS, or a dotted name (`tl.arange`, `gemm_task`); a method call (`x.to(tl.float16)`)
    is a Call of an Attr."""

    fn: str | Expr
    args: tuple[Expr, ...] = ()


@dataclass(frozen=True)
class Attr(Expr):
    value: Expr
    attr: str


@dataclass(frozen=True)
class Index(Expr):
    """value[items]: broadcasting a vector (`m_r[:, None]`)."""

    value: Expr
    items: tuple[Expr, ...]


@dataclass(frozen=True)
class Slice(Expr):
    """`:` in an Index."""


@dataclass(frozen=True)
class Tuple(Expr):
    items: tuple[Expr, ...]


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Bin):
        return (e.left, e.right)
    if isinstance(e, Unary):
        return (e.operand,)
    if isinstance(e, Kw):
        return (e.value,)
    if isinstance(e, Call):
        return (*((e.fn,) if isinstance(e.fn, Expr) else ()), *e.args)
    if isinstance(e, Attr):
        return (e.value,)
    if isinstance(e, Index):
        return (e.value, *e.items)
    if isinstance(e, Tuple):
        return e.items
    return ()


def map_expr(e: Expr, f: Callable[[Expr], Expr]) -> Expr:
    """e with f applied bottom-up to every sub-expression (f sees its children already mapped)."""
    if isinstance(e, Bin):
        e = replace(e, left=map_expr(e.left, f), right=map_expr(e.right, f))
    elif isinstance(e, Unary):
        e = replace(e, operand=map_expr(e.operand, f))
    elif isinstance(e, Kw):
        e = replace(e, value=map_expr(e.value, f))
    elif isinstance(e, Call):
        fn = map_expr(e.fn, f) if isinstance(e.fn, Expr) else e.fn
        e = replace(e, fn=fn, args=tuple(map_expr(a, f) for a in e.args))
    elif isinstance(e, Attr):
        e = replace(e, value=map_expr(e.value, f))
    elif isinstance(e, Index):
        e = replace(e, value=map_expr(e.value, f), items=tuple(map_expr(a, f) for a in e.items))
    elif isinstance(e, Tuple):
        e = replace(e, items=tuple(map_expr(a, f) for a in e.items))
    return f(e)


def names_in(e: Expr) -> Iterator[str]:
    """The variables an expression reads."""
    if isinstance(e, Name):
        yield e.id
    for c in children(e):
        yield from names_in(c)


def calls_in(e: Expr) -> Iterator[Call]:
    if isinstance(e, Call):
        yield e
    for c in children(e):
        yield from calls_in(c)


# -- statements --------------------------------------------------------------------------------------------
class Stmt:
    __slots__ = ()


@dataclass(frozen=True)
class Comment(Stmt):
    text: str  # without the leading "# "


@dataclass(frozen=True)
class Assign(Stmt):
    target: Expr  # a Name, or a Tuple of Names
    value: Expr
    comment: str = ""


@dataclass(frozen=True)
class AugAssign(Stmt):
    target: Name
    op: str
    value: Expr
    comment: str = ""


@dataclass(frozen=True)
class Do(Stmt):
    """An expression evaluated for its effect (a store, a wait, a task call)."""

    expr: Expr
    comment: str = ""


@dataclass(frozen=True)
class For(Stmt):
    """for var in range(start, stop, step); step None: range(start, stop). claim: a persistent kernel's task loop
    whose programs may instead take their tasks, in order, from the counter at this address (a kernel's CLAIM
    switch picks one at compile time): the same iterations for every rewrite, so only printers tell them apart."""

    var: str
    start: Expr
    stop: Expr
    step: Expr | None
    body: tuple[Stmt, ...]
    comment: str = ""
    claim: Expr | None = None
    ordered: bool = False  # its body waits: printers keep the loop out of software pipelining (rewrites.order_waits)


@dataclass(frozen=True)
class If(Stmt):
    """if cond: body, else: orelse; an orelse of one If prints as `elif` when `elif_` is set on it."""

    cond: Expr
    body: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...] = ()
    comment: str = ""
    else_comment: str = ""
    elif_: bool = False


@dataclass(frozen=True)
class Param:
    name: str
    constexpr: bool = False
    default: str | None = None  # a default the launch may leave out (source text)


@dataclass(frozen=True)
class Fn:
    name: str
    params: tuple[Param, ...]
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class Kernel:
    entry: Fn
    tasks: tuple[Fn, ...] = ()


@dataclass(frozen=True)
class Module:
    kernels: tuple[Kernel, ...] = field(default_factory=tuple)


def targets(s: Stmt) -> tuple[str, ...]:
    """The names a statement itself binds (not those of its nested blocks)."""
    if isinstance(s, Assign):
        return tuple(names_in(s.target))
    if isinstance(s, AugAssign):
        return (s.target.id,)
    if isinstance(s, For):
        return (s.var,)
    return ()


def exprs(s: Stmt) -> tuple[Expr, ...]:
    """The expressions a statement itself evaluates (not those of its nested blocks)."""
    if isinstance(s, Assign | AugAssign):
        return (s.value,)
    if isinstance(s, Do):
        return (s.expr,)
    if isinstance(s, For):
        return (s.start, s.stop, *(e for e in (s.step, s.claim) if e is not None))
    if isinstance(s, If):
        return (s.cond,)
    return ()


def blocks(s: Stmt) -> tuple[tuple[Stmt, ...], ...]:
    if isinstance(s, For):
        return (s.body,)
    if isinstance(s, If):
        return (s.body, s.orelse)
    return ()


def walk(body: tuple[Stmt, ...]) -> Iterator[Stmt]:
    """Every statement of a body, nested ones included, in order."""
    for s in body:
        yield s
        for b in blocks(s):
            yield from walk(b)


def reads(body: tuple[Stmt, ...]) -> Iterator[str]:
    """Every variable a body reads (AugAssign reads its target)."""
    for s in walk(body):
        for e in exprs(s):
            yield from names_in(e)
        if isinstance(s, AugAssign):
            yield s.target.id


def map_stmts(body: tuple[Stmt, ...], f: Callable[[Stmt], tuple[Stmt, ...]]) -> tuple[Stmt, ...]:
    """body with every statement (nested blocks first) replaced by f's statements."""
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, For):
            s = replace(s, body=map_stmts(s.body, f))
        elif isinstance(s, If):
            s = replace(s, body=map_stmts(s.body, f), orelse=map_stmts(s.orelse, f))
        out += f(s)
    return tuple(out)


def map_exprs(body: tuple[Stmt, ...], f: Callable[[Expr], Expr]) -> tuple[Stmt, ...]:
    """body with f applied bottom-up to every expression of every statement."""

    def one(s: Stmt) -> tuple[Stmt, ...]:
        if isinstance(s, Assign | AugAssign):
            return (replace(s, value=map_expr(s.value, f)),)
        if isinstance(s, Do):
            return (replace(s, expr=map_expr(s.expr, f)),)
        if isinstance(s, For):
            step = map_expr(s.step, f) if s.step is not None else None
            claim = map_expr(s.claim, f) if s.claim is not None else None
            return (replace(s, start=map_expr(s.start, f), stop=map_expr(s.stop, f), step=step, claim=claim),)
        if isinstance(s, If):
            return (replace(s, cond=map_expr(s.cond, f)),)
        return (s,)

    return map_stmts(body, one)


def int_value(e: Expr) -> int | None:
    """The value of an integer literal (a negative one included), else None."""
    if isinstance(e, Const) and type(e.value) is int:
        return e.value
    if isinstance(e, Unary) and e.op == "-" and isinstance(e.operand, Const) and type(e.operand.value) is int:
        return -e.operand.value
    return None


def const(v: int) -> Expr:
    return Const(v) if v >= 0 else Unary("-", Const(-v))
