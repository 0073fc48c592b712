"""Simplifications of the kernel IR (kir.py), each a small rewrite of one function's body, run before any printing.

Each rewrite keeps what the kernel does: the same loads, stores, atomics and waits in the same order, with the same
operands; only names that hold a constant or a copy, values nobody reads, and loops of one trip go. The order they
run in is `simplify`'s; each is tested on its own (tests/test_kernel_ir.py).
"""

from __future__ import annotations

from dataclasses import replace

from . import kir as K
from .text import Names

# calls without effects: a statement whose value is only these (and arithmetic) may go when nobody reads it
PURE_CALLS = frozenset({
    "tl.arange", "tl.max_contiguous", "tl.multiple_of", "tl.zeros", "tl.full", "tl.minimum", "tl.maximum",
    "tl.where", "tl.reshape", "tl.broadcast_to", "tl.exp", "tl.log", "tl.sqrt", "tl.abs", "tl.sigmoid", "tl.max",
    "tl.num_programs", "peer_offset",
})


# -- constant folding -------------------------------------------------------------------------------------
def fold(e: K.Expr) -> K.Expr:
    """Integer identities of index arithmetic: `x + 0`, `x * 1`, `x // 1`, `1 * x`, adjacent integer constants of a
    sum (`lo + 0 + 64 - 1` is `lo + 63`) and products or quotients of two constants. No reassociation beyond
    adjacent constants, so no sum changes the order of its terms and no int32 partial sum can overflow where it
    did not before."""
    return K.map_expr(e, _fold_one)


def _fold_one(e: K.Expr) -> K.Expr:
    if not isinstance(e, K.Bin):
        return e
    if e.op in ("+", "-"):
        return _sum(e)
    left, right = K.int_value(e.left), K.int_value(e.right)
    if e.op == "*":
        if right == 1:
            return e.left
        if left == 1:
            return e.right
        if left is not None and right is not None:
            return K.const(left * right)
    if e.op == "//":
        if right == 1:
            return e.left
        if left is not None and right is not None and left >= 0 and right > 0:  # C and Python agree here
            return K.const(left // right)
    return e


def _sum(node: K.Expr) -> K.Expr:
    terms: list[tuple[int, K.Expr]] = []  # (sign, term) along the left spine of a + / - chain
    while isinstance(node, K.Bin) and node.op in ("+", "-"):
        terms.append((1 if node.op == "+" else -1, node.right))
        node = node.left
    terms.append((1, node))
    terms.reverse()
    out: list[tuple[int, K.Expr]] = []
    for sign, t in terms:
        v = K.int_value(t)
        if v is not None:
            if out and K.int_value(out[-1][1]) is not None:  # adjacent constants: one constant
                prev = out.pop()
                v = prev[0] * K.int_value(prev[1]) + sign * v
            else:
                v = sign * v
            if v:
                out.append((1, K.const(v)))
            continue
        out.append((sign, t))
    if not out:
        return K.Const(0)
    sign, expr = out[0]
    if sign < 0:
        expr = K.Unary("-", expr)
    for sign, t in out[1:]:
        v = K.int_value(t)
        if v is not None and v < 0:  # x + -3 reads x - 3
            sign, t = -sign, K.Const(-v)
        expr = K.Bin("+" if sign > 0 else "-", expr, t)
    return expr


def fold_constants(body: tuple[K.Stmt, ...]) -> tuple[K.Stmt, ...]:
    """Every expression of a body folded (fold)."""
    return K.map_exprs(body, _fold_one)


# -- names that hold a constant or a copy -------------------------------------------------------------------
def assignments(fn: K.Fn) -> dict[str, int]:
    """How many times each name of a function is bound (a parameter once, each Assign, AugAssign, loop)."""
    n: dict[str, int] = {p.name: 1 for p in fn.params}
    for s in K.walk(fn.body):
        for t in K.targets(s):
            n[t] = n.get(t, 0) + 1
    return n


def propagate(fn: K.Fn) -> K.Fn:
    """`x = 3` or `x = y`, where x is bound only there and y is bound once and not by a loop, goes: every read of
    x reads the constant or y (`k = 0` ... `k + tl.arange(0, 32)` is `0 + tl.arange(0, 32)`, which fold then
    shortens)."""
    count = assignments(fn)
    loops = {s.var for s in K.walk(fn.body) if isinstance(s, K.For)}
    sub: dict[str, K.Expr] = {}
    for s in K.walk(fn.body):
        if isinstance(s, K.Assign) and isinstance(s.target, K.Name) and count[s.target.id] == 1:
            v = s.value
            if K.int_value(v) is not None or (isinstance(v, K.Name) and count.get(v.id) == 1 and v.id not in loops):
                sub[s.target.id] = v
    if not sub:
        return fn

    def resolve(e: K.Expr) -> K.Expr:
        while isinstance(e, K.Name) and e.id in sub:
            e = sub[e.id]
        return e

    def drop(s: K.Stmt) -> tuple[K.Stmt, ...]:
        if isinstance(s, K.Assign) and isinstance(s.target, K.Name) and s.target.id in sub:
            return ()
        return (s,)

    body = K.map_exprs(K.map_stmts(fn.body, drop), resolve)
    return replace(fn, body=body)


def merge_reassign(body: tuple[K.Stmt, ...]) -> tuple[K.Stmt, ...]:
    """`x = a` directly followed by `x = f(x)`, f reading x once, is `x = f(a)` (`idx_2 = 0` then
    `idx_2 = idx_2 + tl.arange(0, 32)`)."""

    def block(stmts: tuple[K.Stmt, ...]) -> tuple[K.Stmt, ...]:
        out: list[K.Stmt] = []
        for s in stmts:
            if isinstance(s, K.For):
                s = replace(s, body=block(s.body))
            elif isinstance(s, K.If):
                s = replace(s, body=block(s.body), orelse=block(s.orelse))
            prev = out[-1] if out else None
            if isinstance(s, K.Assign) and isinstance(s.target, K.Name) and isinstance(prev, K.Assign) and \
                    prev.target == s.target and not prev.comment and \
                    sum(1 for n in K.names_in(s.value) if n == s.target.id) == 1:
                x = s.target.id
                out[-1] = replace(s, value=K.map_expr(s.value, lambda e, x=x, a=prev.value: a if e == K.Name(x) else e))
                continue
            out.append(s)
        return tuple(out)

    return block(body)


def forward_copy(body: tuple[K.Stmt, ...], count: dict[str, int]) -> tuple[K.Stmt, ...]:
    """`x = y` (y bound once) whose reads all come before x's next binding in the same block, that binding
    included, goes: those reads read y (`idx = m; idx_rk = idx // 128; idx = idx - 128 * idx_rk` is
    `idx_rk = m // 128; idx = m - 128 * idx_rk`)."""

    def block(stmts: tuple[K.Stmt, ...]) -> tuple[K.Stmt, ...]:
        out = [replace(s, body=block(s.body)) if isinstance(s, K.For) else
               replace(s, body=block(s.body), orelse=block(s.orelse)) if isinstance(s, K.If) else s for s in stmts]
        i = 0
        while i < len(out):
            s = out[i]
            if isinstance(s, K.Assign) and isinstance(s.target, K.Name) and isinstance(s.value, K.Name) and \
                    count.get(s.value.id) == 1 and count.get(s.target.id, 0) > 1:
                x, y = s.target.id, s.value
                j = next((j for j in range(i + 1, len(out)) if x in K.targets(out[j])), None)
                nested = any(x in K.targets(t) for o in out[i + 1: j] for b in K.blocks(o) for t in K.walk(b))
                if j is not None and isinstance(out[j], K.Assign) and not nested:
                    swap = (lambda e, x=x, y=y: y if e == K.Name(x) else e)
                    mid = K.map_exprs(tuple(out[i + 1: j]), swap)
                    out = out[:i] + list(mid) + [replace(out[j], value=K.map_expr(out[j].value, swap))] + out[j + 1:]
                    continue
            i += 1
        return tuple(out)

    return block(body)


# -- loops of one trip ------------------------------------------------------------------------------------
def _linear(e: K.Expr) -> dict[K.Expr | None, int]:
    """e as a sum of integer multiples of its non-linear parts (key None: the constant)."""
    v = K.int_value(e)
    if v is not None:
        return {None: v}
    if isinstance(e, K.Bin) and e.op in ("+", "-"):
        out = dict(_linear(e.left))
        for k, c in _linear(e.right).items():
            out[k] = out.get(k, 0) + (c if e.op == "+" else -c)
        return out
    if isinstance(e, K.Bin) and e.op == "*":
        for a, b in ((e.left, e.right), (e.right, e.left)):
            c = K.int_value(a)
            if c is not None:
                return {k: c * x for k, x in _linear(b).items()}
    return {e: 1}


def trips(s: K.For) -> int | None:
    """How many times a loop runs, where its bounds differ by a constant."""
    d = _linear(s.stop)
    for k, c in _linear(s.start).items():
        d[k] = d.get(k, 0) - c
    if any(c for k, c in d.items() if k is not None):
        return None
    step = 1 if s.step is None else K.int_value(s.step)
    if not step or step < 0:
        return None
    return max(0, -(-d.get(None, 0) // step))


def unroll_one_trip(body: tuple[K.Stmt, ...]) -> tuple[K.Stmt, ...]:
    """`for x in range(a, a + 1): body` is `x = a` then body (a wait over one counter, one block of keys)."""

    def one(s: K.Stmt) -> tuple[K.Stmt, ...]:
        if isinstance(s, K.For) and trips(s) == 1:
            return (K.Assign(K.Name(s.var), s.start, s.comment), *s.body)
        return (s,)

    return K.map_stmts(body, one)


# -- values nobody reads ----------------------------------------------------------------------------------
def pure(e: K.Expr) -> bool:
    """Whether evaluating e has no effect but its value (arithmetic and PURE_CALLS, `.to(...)`; no load)."""
    for c in K.calls_in(e):
        if isinstance(c.fn, K.Attr):
            if c.fn.attr != "to":
                return False
        elif c.fn not in PURE_CALLS:
            return False
    return True


def drop_dead(body: tuple[K.Stmt, ...], live_out: frozenset[str] = frozenset()) -> tuple[K.Stmt, ...]:
    """Statements whose values nobody reads (no later statement, no later trip of an enclosing loop) and that have
    no effect go (`k_r = k + tl.arange(0, 32)` in a loop that walks pointers instead)."""
    return _live(body, set(live_out))[0]


def _uses(e: K.Expr) -> set[str]:
    return set(K.names_in(e))


def _live(body: tuple[K.Stmt, ...], live: set[str]) -> tuple[tuple[K.Stmt, ...], set[str]]:
    """(body without its dead statements, the names live before it), given those live after it."""
    out: list[K.Stmt] = []
    live = set(live)
    for s in reversed(body):
        if isinstance(s, K.Assign | K.AugAssign):
            names = set(K.targets(s))
            if not names & live and pure(s.value):
                continue
            if isinstance(s, K.Assign):
                live -= names
            live |= _uses(s.value) | (names if isinstance(s, K.AugAssign) else set())
        elif isinstance(s, K.Do):
            live |= _uses(s.expr)
        elif isinstance(s, K.If):
            b, lb = _live(s.body, live)
            o, lo = _live(s.orelse, live)
            s = replace(s, body=b, orelse=o)
            live = lb | lo | _uses(s.cond)
        elif isinstance(s, K.For):
            carried: set[str] = set()
            while True:  # what a trip reads of the trips before it
                b, lb = _live(s.body, live | carried)
                if lb - {s.var} <= carried:
                    break
                carried |= lb - {s.var}
            s = replace(s, body=b)
            live = live | carried | set().union(*(_uses(e) for e in K.exprs(s)))
            live.discard(s.var)
            live |= carried - {s.var}
        out.append(s)
    return tuple(reversed(out)), live


# -- common values and values read once -------------------------------------------------------------------
INLINE_CALLS = frozenset({"tl.arange", "tl.minimum", "tl.maximum"})  # cheap enough to write where they are read
INLINE_SIZE = 12  # a value of at most this many nodes is written where it is read once


def _size(e: K.Expr) -> int:
    return 1 + sum(_size(c) for c in K.children(e))


def _stable(e: K.Expr, count: dict[str, int]) -> bool:
    """Whether every name e reads is bound once (so e has one value wherever it is read)."""
    return all(count.get(n, 0) <= 1 for n in K.names_in(e))


def share_common(fn: K.Fn, keep: frozenset[str] = frozenset()) -> K.Fn:
    """Two names bound once, in the function's top level, to the same value that has no effect: one name serves
    both, bound where the first was (`_a1_r`, `_a2_r`, `_a3_r`, each `tl.arange(0, 64)` with its hints, are
    `_a0_r`); the name kept is a name of `keep` (a loop variable's range: `k_r`) where one of them is."""
    count = assignments(fn)
    groups: dict[K.Expr, list[str]] = {}
    for s in fn.body:
        if isinstance(s, K.Assign) and isinstance(s.target, K.Name) and count[s.target.id] == 1 and \
                pure(s.value) and _stable(s.value, count) and not isinstance(s.value, K.Name):
            groups.setdefault(s.value, []).append(s.target.id)
    same: dict[str, str] = {}
    for names in groups.values():
        if len(names) > 1:
            name = next((n for n in names if n in keep), names[0])
            same |= {n: name for n in names}
    if not same:
        return fn
    body: list[K.Stmt] = []
    bound: set[str] = set()
    for s in fn.body:
        if isinstance(s, K.Assign) and isinstance(s.target, K.Name) and s.target.id in same:
            name = same[s.target.id]
            if name in bound:
                continue
            bound.add(name)
            s = replace(s, target=K.Name(name), comment=s.comment if s.target.id == name else "")
        body.append(s)
    return replace(fn, body=K.map_exprs(tuple(body), lambda e: K.Name(same[e.id]) if isinstance(e, K.Name) and
                                        e.id in same else e))


def _cheap(e: K.Expr) -> bool:
    return _size(e) <= INLINE_SIZE and all(isinstance(c.fn, str) and c.fn in INLINE_CALLS for c in K.calls_in(e))


def inline_once(fn: K.Fn, keep: frozenset[str] = frozenset()) -> K.Fn:
    """A name bound once to a small value without loads or effects and read once, by a later statement of the same
    block (or an `if` inside it, not a loop), is written where it is read (`mul_val = rank * 128` then
    `sub_val = lens_val - mul_val` is `sub_val = lens_val - rank * 128`)."""
    count = assignments(fn)
    reads: dict[str, int] = {}
    for n in K.reads(fn.body):
        reads[n] = reads.get(n, 0) + 1

    def candidate(s: K.Stmt) -> bool:
        return isinstance(s, K.Assign) and isinstance(s.target, K.Name) and not s.comment and \
            s.target.id not in keep and count[s.target.id] == 1 and reads.get(s.target.id) == 1 and \
            _cheap(s.value) and _stable(s.value, count)

    def reached(x: str, stmts: tuple[K.Stmt, ...]) -> bool | None:
        """True: the read of x is in these statements outside any loop; False: inside a loop; None: not here."""
        for s in stmts:
            if any(x in K.names_in(e) for e in K.exprs(s)):
                return True
            if isinstance(s, K.For) and x in set(K.reads(s.body)):
                return False
            if isinstance(s, K.If):
                for b in (s.body, s.orelse):
                    r = reached(x, b)
                    if r is not None:
                        return r
        return None

    def block(stmts: tuple[K.Stmt, ...]) -> tuple[K.Stmt, ...]:
        stmts = tuple(replace(s, body=block(s.body)) if isinstance(s, K.For) else
                      replace(s, body=block(s.body), orelse=block(s.orelse)) if isinstance(s, K.If) else s
                      for s in stmts)
        out = list(stmts)
        i = 0
        while i < len(out):
            s = out[i]
            if candidate(s) and reached(s.target.id, tuple(out[i + 1:])):
                x, v = s.target.id, s.value
                rest = K.map_exprs(tuple(out[i + 1:]), lambda e, x=x, v=v: v if e == K.Name(x) else e)
                out = out[:i] + list(rest)
                continue
            i += 1
        return tuple(out)

    return replace(fn, body=block(fn.body))


# -- the order of the rewrites ----------------------------------------------------------------------------
def simplify_fn(fn: K.Fn, keep: frozenset[str] = frozenset()) -> K.Fn:
    """Fold, propagate, merge, unroll, drop, share and inline until nothing changes, then bind the numbers that must
    be tensors (materialize). keep: names a reader looks for (the stage's loop variables and their ranges), never
    written into their one reader."""
    while True:
        new = replace(fn, body=fold_constants(fn.body))
        new = propagate(new)
        new = replace(new, body=forward_copy(new.body, assignments(new)))
        new = replace(new, body=fold_constants(unroll_one_trip(merge_reassign(new.body))))
        new = replace(new, body=drop_dead(new.body))
        new = inline_once(share_common(new, keep), keep)
        if new == fn:
            return materialize(fn)
        fn = new


def _number(e: K.Expr) -> bool:
    """Built of numeric literals and arithmetic alone: a Python number inside a kernel, not a tensor."""
    if isinstance(e, K.Const):
        return type(e.value) in (int, float)
    if isinstance(e, K.Unary):
        return e.op == "-" and _number(e.operand)
    if isinstance(e, K.Bin):
        return _number(e.left) and _number(e.right)
    return False


# the arguments of these calls must be tensors, not Python numbers
TENSOR_ARGS = {"tl.broadcast_to": (0,)}


def materialize(fn: K.Fn) -> K.Fn:
    """A number where a tensor must stand (the value `tl.broadcast_to` spreads, the receiver of a method call such as
    `.to`) is bound to a name first: `x = -2` makes x an int32 tensor (Triton converts a number on assignment), while
    `tl.broadcast_to(-2, ...)` passes a Python int that the call cannot take. Propagation and inlining write numbers
    into their readers; this undoes it where the reader needs a tensor."""
    names = Names({p.name for p in fn.params} | set(K.reads(fn.body))
                  | {t for s in K.walk(fn.body) for t in K.targets(s)})

    def stmt(s: K.Stmt) -> tuple[K.Stmt, ...]:
        bound: list[K.Stmt] = []

        def bind(e: K.Expr) -> K.Expr:
            x = names.new("const_val")
            bound.append(K.Assign(K.Name(x), e))
            return K.Name(x)

        def fix(e: K.Expr) -> K.Expr:
            if isinstance(e, K.Call) and isinstance(e.fn, str) and e.fn in TENSOR_ARGS:
                args = tuple(bind(a) if i in TENSOR_ARGS[e.fn] and _number(a) else a for i, a in enumerate(e.args))
                return replace(e, args=args)
            if isinstance(e, K.Call) and isinstance(e.fn, K.Attr) and _number(e.fn.value):
                return replace(e, fn=replace(e.fn, value=bind(e.fn.value)))
            return e

        if K.blocks(s):  # a compound statement: only its own expressions (its blocks were done first)
            own = K.map_exprs((replace(s, **{f: () for f in ("body", "orelse") if hasattr(s, f)}),), fix)[0]
            s = replace(own, **{f: getattr(s, f) for f in ("body", "orelse") if hasattr(s, f)})
        else:
            s = K.map_exprs((s,), fix)[0]
        return (*bound, s)

    return replace(fn, body=K.map_stmts(fn.body, stmt))


def drop_unused_params(k: K.Kernel) -> K.Kernel:
    """A task function's parameters that its body never reads go, and its calls' arguments with them (the entry's
    parameters are the launch's: they stay)."""
    tasks = list(k.tasks)
    entry = k.entry
    while True:
        names = {f.name: i for i, f in enumerate(tasks)}
        cut: dict[str, set[int]] = {}
        for f in tasks:
            used = set(K.reads(f.body))
            gone = {i for i, p in enumerate(f.params) if p.name not in used}
            if gone:
                cut[f.name] = gone
        if not cut:
            return K.Kernel(entry, tuple(tasks))

        def trim(e: K.Expr, cut: dict[str, set[int]] = cut) -> K.Expr:
            if isinstance(e, K.Call) and isinstance(e.fn, str) and e.fn in cut:
                return replace(e, args=tuple(a for i, a in enumerate(e.args) if i not in cut[e.fn]))
            return e

        for name, gone in cut.items():
            f = tasks[names[name]]
            tasks[names[name]] = replace(f, params=tuple(p for i, p in enumerate(f.params) if i not in gone))
        tasks = [replace(f, body=K.map_exprs(f.body, trim)) for f in tasks]
        entry = replace(entry, body=K.map_exprs(entry.body, trim))


def bind_constants(k: K.Kernel, values: dict[str, int]) -> K.Kernel:
    """Parameters whose value is known where the kernel is compiled (`rank` in a world of one is 0) read as that
    constant in every function; parameters and calls stay (drop_unused_params then trims what no body reads). A name
    a function binds itself is left alone there."""

    def one(fn: K.Fn) -> K.Fn:
        bound = {t for s in K.walk(fn.body) for t in K.targets(s)}
        m = {a: v for a, v in values.items() if a not in bound}
        if not m:
            return fn
        return replace(fn, body=K.map_exprs(fn.body, lambda e: K.const(m[e.id]) if isinstance(e, K.Name)
                                            and e.id in m else e))

    return K.Kernel(one(k.entry), tuple(one(f) for f in k.tasks))


def rename(k: K.Kernel, names: dict[str, str]) -> K.Kernel:
    """Names as a reader expects them (`m_r` -> `rm`), in each function where the new name is not taken."""

    def one(fn: K.Fn) -> K.Fn:
        taken = {p.name for p in fn.params} | set(K.reads(fn.body)) | {t for s in K.walk(fn.body) for t in K.targets(s)}
        m = {a: b for a, b in names.items() if a in taken and b not in taken}
        if not m:
            return fn
        sub = (lambda e: K.Name(m[e.id]) if isinstance(e, K.Name) and e.id in m else e)

        def stmt(s: K.Stmt) -> tuple[K.Stmt, ...]:
            if isinstance(s, K.Assign):
                return (replace(s, target=K.map_expr(s.target, sub)),)
            if isinstance(s, K.AugAssign):
                return (replace(s, target=sub(s.target)),)
            if isinstance(s, K.For) and s.var in m:
                return (replace(s, var=m[s.var]),)
            return (s,)

        return replace(fn, body=K.map_exprs(K.map_stmts(fn.body, stmt), sub))

    return K.Kernel(one(k.entry), tuple(one(f) for f in k.tasks))


def simplify(k: K.Kernel, keep: dict[str, frozenset[str]] | None = None) -> K.Kernel:
    """A kernel's functions, each simplified (simplify_fn, keep: per function name), then its task functions'
    unused parameters gone."""
    keep = keep or {}
    k = K.Kernel(simplify_fn(k.entry, keep.get(k.entry.name, frozenset())),
                 tuple(simplify_fn(f, keep.get(f.name, frozenset())) for f in k.tasks))
    return drop_unused_params(k)


# calls that order the loads after them: a load of a later iteration must not be issued before one of these
SYNC_CALLS = frozenset({"wait", "wait_all", "arrive", "arrive_left", "td.rows_unique", "td.barrier"})


def order_waits(k: K.Kernel) -> K.Kernel:
    """Loops that wait, marked `ordered`: Triton's software pipeliner issues the loads of later iterations of an
    innermost loop early, above that iteration's waits (it does not order loads after atomics), so a task loop
    whose tasks wait, or a loop of blocks that waits per block, would read tiles before their producer released
    them. Before: `for task in range(...): gemm_task(...)` (gemm_task waits, then loads, no inner loop). After: the
    same loop with ordered=True (printed `tl.range(..., num_stages=1)`). A loop whose body only calls functions
    that never wait is left as it is."""
    waits: set[str] = set()
    changed = True
    while changed:  # task functions that wait, directly or through a function that does
        changed = False
        for f in k.tasks:
            if f.name not in waits and _waits(f.body, waits):
                waits.add(f.name)
                changed = True

    def mark(s: K.Stmt) -> tuple[K.Stmt, ...]:
        if isinstance(s, K.For) and not s.ordered and _waits(s.body, waits):
            return (replace(s, ordered=True),)
        return (s,)

    return K.Kernel(replace(k.entry, body=K.map_stmts(k.entry.body, mark)),
                    tuple(replace(f, body=K.map_stmts(f.body, mark)) for f in k.tasks))


def _waits(body: tuple[K.Stmt, ...], waiting_fns: set[str]) -> bool:
    return any(c.fn in SYNC_CALLS or c.fn in waiting_fns
               for s in K.walk(body) for e in K.exprs(s) for c in K.calls_in(e) if isinstance(c.fn, str))


def range_names(loop_vars: set[str]) -> dict[str, str]:
    """A tile loop variable's index vector as the Iris examples name it: `rm` for m's `m_r` (`:` slices, named
    `_aN` by the frontend, keep theirs)."""
    return {f"{v}_r": f"r{v}" for v in loop_vars if not v.startswith("_")}
