"""Text -> AST. Syntax errors become `file:line:col` diagnostics with a caret and a friendly message."""

from __future__ import annotations

import os
import stat
from functools import cache
from pathlib import Path

from lark import Lark, Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from tilec.errors import CompileError, Diagnostic, Loc
from tilec.frontend import ast
from tilec.frontend.limits import MAX_DEPTH, MAX_LITERAL, MAX_SOURCE
from tilec.ir.dtypes import DTYPES

# Expression rules of the grammar: the parse tree nests one of these per operator, call or reduction (parentheses
# add none). Everything after the parser recurses over expressions, so their depth is bounded before it does.
_EXPR_RULES = frozenset({"add", "sub", "mul", "div", "mod", "matmul", "neg", "call", "reduce", "ref"})

_MESSAGES = {
    "loop": "a tile loop is `VAR in EXTENT by TILE` (or `VAR in ranks`)",
    "body": "a stage body is one or more assignments `X[...] = expr`",
    "tensor": "tensor declarations look like `in A : f16[M, K] symmetric`",
}
# Common mistakes, recognised by lark's match_examples, mapped to messages users can act on.
_EXAMPLES: dict[str, list[str]] = {
    "a program starts with `program <name>(world W)`": ["dims M", "stage s over m in M by BM:\n X[m] = Y[m]"],
    "expected `(world W)` after the program name": ["program p\n", "program p(W)"],
    "a stage needs `over LOOPS:` before its body": ["program p(world W)\nstage s:\n"],
    _MESSAGES["loop"]: [
        "program p(world W)\nstage s over m in M:",
        "program p(world W)\nstage s over m by BM:",
    ],
    _MESSAGES["body"]: [
        "program p(world W)\nstage s over m in M by BM:\nbarrier",
        "program p(world W)\nstage s over m in M by BM:\n",
    ],
    _MESSAGES["tensor"]: [
        "program p(world W)\nin A f16[M]",
        "program p(world W)\nin A : [M]",
        "program p(world W)\nin A : f64[M]",
    ],
    "unbalanced brackets in an index": ["program p(world W)\nstage s over m in M by BM:\n X[m = Y[m]"],
}


@cache
def _parser() -> Lark:
    grammar = (Path(__file__).parent / "tile.lark").read_text()
    return Lark(grammar, parser="lalr", propagate_positions=True, maybe_placeholders=False)


def _binop(op: str):
    @v_args(meta=True)
    def f(self, meta, children):
        return ast.BinOp(op, children[0], children[1], self._loc(meta))

    return f


class _ToAst(Transformer):
    def __init__(self, file: str, source: str):
        super().__init__()
        self.file = file
        self.source = source

    def _loc(self, meta_or_tok) -> Loc:
        m = meta_or_tok
        if isinstance(m, Token):
            return Loc(self.file, m.line, m.column, m.end_line or m.line, m.end_column or m.column + 1)
        if getattr(m, "empty", False):
            return Loc(self.file, 0, 0)
        return Loc(self.file, m.line, m.column, m.end_line, m.end_column)

    @v_args(meta=True)
    def program(self, meta, children):
        name, world, *rest = children
        dims, tiles, tensors, items = [], [], [], []
        for c in rest:
            if isinstance(c, list) and c and isinstance(c[0], ast.DimDef):
                dims += c
            elif isinstance(c, list) and c and isinstance(c[0], ast.TileDef):
                tiles += c
            elif isinstance(c, ast.TensorDecl):
                tensors.append(c)
            else:
                items.append(c)
        return ast.Program(str(name), str(world), tuple(dims), tuple(tiles), tuple(tensors), tuple(items),
                           self._loc(meta), self.source)

    def start(self, children):
        return children[0]

    def dims_decl(self, children):
        return list(children)

    tiles_decl = dims_decl

    @v_args(meta=True)
    def dimdef(self, meta, children):
        default = self._int(children[1]) if len(children) > 1 else None
        return ast.DimDef(str(children[0]), default, self._loc(meta))

    @v_args(meta=True)
    def tiledef(self, meta, children):
        return ast.TileDef(str(children[0]), self._int(children[1]), self._loc(meta))

    @v_args(meta=True)
    def tensor_decl(self, meta, children):
        kind, name, dtype, *rest = children
        symmetric = bool(rest) and isinstance(rest[-1], Token) and rest[-1].type == "SYMMETRIC"
        shape = tuple(rest[:-1] if symmetric else rest)
        return ast.TensorDecl(str(kind), str(name), str(dtype), shape, symmetric, self._loc(meta))

    @v_args(meta=True)
    def barrier(self, meta, children):
        return ast.Barrier(self._loc(meta))

    @v_args(meta=True)
    def stage(self, meta, children):
        name, *rest = children
        loops = tuple(c for c in rest if isinstance(c, ast.Loop))
        body = tuple(c for c in rest if isinstance(c, ast.Assign))
        return ast.Stage(str(name), loops, body, self._loc(name))

    @v_args(meta=True)
    def rank_loop(self, meta, children):
        return ast.Loop(str(children[0]), "rank", None, None, self._loc(meta))

    @v_args(meta=True)
    def tile_loop(self, meta, children):
        return ast.Loop(str(children[0]), "tile", children[1], children[2], self._loc(meta))

    @v_args(meta=True)
    def counted_loop(self, meta, children):
        return ast.Loop(str(children[0]), "tile", children[1], children[2], self._loc(meta), children[3])

    @v_args(meta=True)
    def assign(self, meta, children):
        return ast.Assign(tuple(children[:-1]), children[-1], self._loc(meta))

    def discard(self, children):
        return None

    @v_args(meta=True)
    def full(self, meta, children):
        return ast.Full(self._loc(meta))

    @v_args(meta=True)
    def ref(self, meta, children):
        head, *index = children
        tensor, _, rank = str(head).partition("@")
        if rank.isdigit():  # `X@0[...]`: a peer expression of one number, as `X@(0)[...]` is
            return ast.Ref(tensor, ast.Int(int(rank), self._loc(head)), tuple(index), self._loc(meta))
        return ast.Ref(tensor, rank or None, tuple(index), self._loc(meta))

    @v_args(meta=True)
    def peer_ref(self, meta, children):
        head, peer, *index = children
        return ast.Ref(str(head)[:-1], peer, tuple(index), self._loc(meta))

    @v_args(meta=True)
    def reduce(self, meta, children):
        var = str(children[0])
        if len(children) == 3:  # sum v in ranks: body
            return ast.Reduce(var, None, None, children[2], self._loc(meta))
        return ast.Reduce(var, children[1], children[2], children[3], self._loc(meta))

    add, sub, mul, div, mod, matmul = (_binop(o) for o in "+-*/%@")
    floordiv = _binop("//")

    @v_args(meta=True)
    def neg(self, meta, children):
        return ast.Neg(children[0], self._loc(meta))

    @v_args(meta=True)
    def call(self, meta, children):
        args = tuple(c for c in children[1:] if not isinstance(c, tuple))
        kw = tuple(c for c in children[1:] if isinstance(c, tuple))
        return ast.Call(str(children[0]), args, self._loc(meta), kw)

    @v_args(meta=True)
    def sum_call(self, meta, children):
        return self.call(meta, [Token("NAME", "sum"), *children])

    def kwarg(self, children):
        return (str(children[0]), children[1])

    @v_args(meta=True)
    def attr(self, meta, children):
        return ast.Attr(children[0], str(children[1]), self._loc(meta))

    def _int(self, t: Token) -> int:
        digits = str(t).lstrip("0")
        if len(digits) > len(str(MAX_LITERAL)) or int(digits or "0") > MAX_LITERAL:  # int() of 5000 digits raises
            raise _Located(self._loc(t), f"integer {_abbrev(t)} is too large (tilec's limit is 2**40 = {MAX_LITERAL})")
        return int(digits or "0")

    def int(self, children):
        t = children[0]
        return ast.Int(self._int(t), self._loc(t))

    def float(self, children):
        t = children[0]
        v = float(t)
        if v == float("inf"):
            raise _Located(self._loc(t), f"number {_abbrev(t)} is too large for a float")
        return ast.Float(v, self._loc(t))

    def name(self, children):
        t = children[0]
        return ast.Name(str(t), self._loc(t))


class _Located(Exception):
    """A problem the transformer finds at a node (raised through lark's VisitError)."""

    def __init__(self, loc: Loc, msg: str):
        super().__init__(msg)
        self.loc, self.msg = loc, msg


def _abbrev(tok: str) -> str:
    tok = str(tok)
    return tok if len(tok) <= 24 else f"{tok[:10]}...{tok[-6:]} ({len(tok)} digits)"


def _too_deep(tree: Tree) -> tuple[Tree, int] | None:
    """The first expression node nested deeper than MAX_DEPTH and the depth of the expression that holds it, found
    without recursion: a RecursionError must not be the way a deep expression is reported."""
    stack: list[tuple[Tree, int, int]] = [(tree, 0, 0)]  # node, depth, id of its outermost expression node
    first: tuple[Tree, int] | None = None
    deepest: dict[int, int] = {}
    while stack:
        node, depth, root = stack.pop()
        if node.data in _EXPR_RULES:
            depth += 1
            root = root or id(node)
            deepest[root] = max(deepest.get(root, 0), depth)
            if depth > MAX_DEPTH and first is None:
                first = (node, root)
        stack.extend((c, depth, root) for c in reversed(node.children) if isinstance(c, Tree))
    return (first[0], deepest[first[1]]) if first else None


def _by_expectation(e: UnexpectedInput, source: str) -> str | None:
    """The same friendly messages for mistakes inside real programs, which lark's match_examples misses (it
    compares whole parser states, stack depth included): judged from what the parser expected and the line."""
    expected = set(getattr(e, "expected", ()) or ())
    lines = source.split("\n")  # lines as lark counts them
    at = lines[e.line - 1].strip() if 0 < e.line <= len(lines) else ""
    if getattr(e, "token", None) is not None and e.token.type == "$END":
        at = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
    if "BY" in expected:
        return _MESSAGES["loop"]
    if expected == {"COLON"} and at.split(" ", 1)[0] in ("in", "out", "buf"):
        return _MESSAGES["tensor"]
    targets = {"NAME", "PEER", "PEER_AT", "UNDERSCORE"}
    if (expected and expected <= targets) or (expected == {"LSQB"} and at == "barrier"):
        return _MESSAGES["body"]
    return None


def _match_examples(e: UnexpectedInput) -> str | None:
    try:
        return e.match_examples(_parser().parse, _EXAMPLES, use_accepts=True)
    except TypeError:  # lark formats a debug message with %d of a ParserState when two examples share a state
        return None


# What the parser expected, in words: a message never names a terminal of tile.lark (LSQB, DTYPE, PEER, ...).
# Terminals that are one fixed string (`[`, `by`, ...) are shown as that string; these are the others.
_DTYPE_LIST = ", ".join(DTYPES)
_IN_WORDS = {
    "NAME": "a name",
    "INT": "an integer",
    "FLOAT": "a number",
    "PEER": "a peer's tile `X@r[...]`",
    "PEER_AT": "a peer's tile `X@(rank + 1)[...]`",
    "DTYPE": f"a dtype: {_DTYPE_LIST}",
    "KIND": "a tensor declaration (`in`, `out`, `buf`)",
    "$END": "the end of the file",
}
# Sets of terminals said as one phrase where the parser would accept any of them.
_EXPR_START = frozenset({"INT", "FLOAT", "NAME", "PEER", "PEER_AT", "LPAR", "MINUS", "SUM"})
_OPERATORS = frozenset({"PLUS", "MINUS", "STAR", "SLASH", "PERCENT", "AT"})
_DECLS = frozenset({"DIMS", "TILES", "KIND"})
_FIRST = ("RSQB", "RPAR", "COMMA", "COLON", "EQUAL")


def _terminal_words(name: str) -> str:
    if name in _IN_WORDS:
        return _IN_WORDS[name]
    try:
        pattern = _parser().get_terminal(name).pattern
    except KeyError:
        return "something else"
    if pattern.type == "str":
        return f"`{pattern.value}`"
    return "something else"  # a terminal added to the grammar without words here (a test catches it)


def expected_in_words(expected) -> str:
    """`{'COMMA', 'RSQB'}` -> "`,` or `]`"; the whole start of an expression is "an expression"."""
    names = {x for x in expected if not x.startswith("__")}
    phrases: list[str] = []
    if len(names & {"INT", "FLOAT", "NAME", "LPAR"}) >= 3:
        names -= _EXPR_START
        phrases.append("an expression")
    if len(names & _OPERATORS) >= 3:
        names -= _OPERATORS
        phrases.append("an operator")
    if len(names & _DECLS) >= 2:
        names -= _DECLS
        phrases.append("a declaration (`dims`, `tiles`, `in`, `out`, `buf`)")
    first = [n for n in _FIRST if n in names]  # what closes or continues the construct at hand, then the rest
    phrases = [_terminal_words(n) for n in first] + phrases
    phrases += [_terminal_words(n) for n in sorted(names - {"$END", *first})]
    if "$END" in names:
        phrases.append(_terminal_words("$END"))
    phrases = list(dict.fromkeys(phrases))
    if len(phrases) <= 1:
        return "".join(phrases)
    return ", ".join(phrases[:-1]) + " or " + phrases[-1]


def _describe(tok: Token | None) -> str:
    if tok is None or tok.type == "$END":
        return "end of file"
    return f"'{tok}'"


def parse(source: str, file: str = "<string>") -> ast.Program:
    """Parse .tile source text; raises CompileError with one located, caret-marked diagnostic."""
    source = source.removeprefix("\ufeff")  # a byte-order mark some editors write first is not program text
    if len(source) > MAX_SOURCE:  # parse time and memory grow with the text: refuse before lexing it
        line = source.count("\n", 0, MAX_SOURCE) + 1
        col = MAX_SOURCE - (source.rfind("\n", 0, MAX_SOURCE) + 1) + 1
        raise CompileError([Diagnostic(Loc(file, line, col), f"program text is {len(source)} characters long: too"
                                       f" long (tilec's limit is {MAX_SOURCE}, reached here)")], source)
    try:
        tree = _parser().parse(source)
    except UnexpectedInput as e:
        friendly = _match_examples(e) or _by_expectation(e, source)
        line, col = max(e.line, 1), max(e.column, 1)
        if isinstance(e, UnexpectedCharacters):
            msg = f"unexpected character {source[e.pos_in_stream]!r}"
        elif isinstance(e, UnexpectedEOF):
            msg = "unexpected end of file"
        elif isinstance(e, UnexpectedToken):
            msg = f"unexpected {_describe(e.token)}"
            if e.token.type == "$END":
                lines = source.rstrip().split("\n")
                line, col = len(lines), len(lines[-1]) + 1
            if "DTYPE" in e.expected and e.token.type == "NAME":  # `f64[...]`: say which dtypes there are
                msg = f"unknown dtype '{e.token}'"
                friendly = f"the dtypes are {_DTYPE_LIST}"
            elif e.expected == {"DTYPE"}:  # `in A : [M]`: what is missing is more to the point than the pattern
                msg += f": expected {_IN_WORDS['DTYPE']}"
                friendly = None
            elif e.expected and not friendly:  # what the parser would really take here (LALR's set is wider)
                msg += ": expected " + expected_in_words(e.accepts or e.expected)
        else:
            msg = "syntax error"
        if friendly:
            msg += f": {friendly}"
        raise CompileError([Diagnostic(Loc(file, line, col), msg)], source) from None
    deep = _too_deep(tree)
    if deep is not None:
        node, depth = deep
        loc = Loc(file, node.meta.line, node.meta.column, node.meta.end_line, node.meta.end_column)
        msg = (f"expression nested too deeply: {depth} levels of operators, calls and sums (tilec's limit is"
               f" {MAX_DEPTH}; a chain like `a + b + c` nests one level per operator, parentheses none): split it"
               " over intermediate tensors")
        raise CompileError([Diagnostic(loc, msg)], source)
    try:
        return _ToAst(file, source).transform(tree)
    except VisitError as e:
        if isinstance(e.orig_exc, _Located):
            raise CompileError([Diagnostic(e.orig_exc.loc, e.orig_exc.msg)], source) from None
        raise  # a transformer bug: a traceback, so that it gets fixed


def decode(data: bytes, file: str) -> str:
    """UTF-8 program text; a byte that is not UTF-8 is an error at its line and column."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        before = data[:e.start]
        line = before.count(b"\n") + 1
        col = len(before[before.rfind(b"\n") + 1:].decode("utf-8")) + 1
        shown = data[e.start:e.end].hex(" ")
        loc = Loc(file, line, col, line, col + 1)
        raise CompileError([Diagnostic(loc, f"invalid UTF-8 byte(s) {shown}: a .tile program is UTF-8 text")],
                           data.decode("utf-8", "replace")) from None


# a FIFO would block the open until a writer came (and `tilec check` reads the program once per schedule), a device
# like /dev/zero would never end
_NOT_FILES = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
              (stat.S_ISSOCK, "a socket"))


def parse_file(path: str | Path) -> ast.Program:
    """The program in the regular file `path`, read up to what the text limit allows."""
    p, file = Path(path), str(path)
    cap = 4 * MAX_SOURCE + 4  # bytes of MAX_SOURCE characters of UTF-8, and one more
    try:
        mode = os.stat(p).st_mode
        kind = next((k for test, k in _NOT_FILES if test(mode)), None)
        if kind:
            raise CompileError([Diagnostic(Loc(file, 0, 0), f"cannot read program: is {kind}, not a file")])
        with open(p, "rb") as f:
            data = f.read(cap + 1)
    except OSError as e:
        raise CompileError([Diagnostic(Loc(file, 0, 0), f"cannot read program: {e.strerror}")]) from None
    if len(data) > cap:  # too long whatever its characters: say where the limit falls, not decode a cut character
        text = data[:cap].decode("utf-8", "replace")
        line = text.count("\n", 0, MAX_SOURCE) + 1
        col = MAX_SOURCE - (text.rfind("\n", 0, MAX_SOURCE) + 1) + 1
        raise CompileError([Diagnostic(Loc(file, line, col), f"program file is {os.path.getsize(p)} bytes long: too"
                                       f" long (tilec's limit is {MAX_SOURCE} characters, reached here)")], text)
    return parse(decode(data, file), file)
