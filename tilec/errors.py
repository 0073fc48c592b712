"""Diagnostics: every user-facing error carries a source location and prints as `file:line:col: message`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Loc:
    """A source span; `line`/`col` are 1-based, as editors show them."""

    file: str
    line: int
    col: int
    end_line: int = 0
    end_col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


NOWHERE = Loc("<tilec>", 0, 0)


@dataclass(frozen=True)
class Diagnostic:
    """One problem at one place; `kind` says who found it: "error" (the parser, sema) or the verifier's rule."""

    loc: Loc
    message: str
    kind: str = "error"

    def render(self, source: str | None = None) -> str:
        where = str(self.loc) if self.loc.line > 0 else self.loc.file  # no position: name the file alone
        head = f"{where}: error: {self.message}"
        if not source or self.loc.line <= 0:
            return head
        lines = source.split("\n")  # as the parser counts lines (splitlines would also split at \f, \x1c, ...)
        if self.loc.line > len(lines):
            return head
        text = lines[self.loc.line - 1].rstrip("\r")
        width = 1
        if self.loc.end_line == self.loc.line and self.loc.end_col > self.loc.col:
            width = self.loc.end_col - self.loc.col
        pad = "".join("\t" if c == "\t" else " " for c in text[:self.loc.col - 1])  # tabs stay tabs: the caret lines up
        return f"{head}\n  {text}\n  {pad.ljust(self.loc.col - 1)}{'^' * width}"


class TilecError(Exception):
    """Base of all errors tilec reports to users (the CLI prints them without a traceback, exit code 2)."""

    exit_code = 2

    def render(self) -> str:
        return str(self)


class CompileError(TilecError):
    """One or more diagnostics about a .tile program, reported together."""

    def __init__(self, diagnostics: list[Diagnostic], source: str | None = None):
        self.diagnostics = list(diagnostics)
        self.source = source
        super().__init__("\n".join(d.render(None) for d in self.diagnostics))

    def render(self) -> str:
        return "\n".join(d.render(self.source) for d in self.diagnostics)


class ScheduleError(TilecError):
    """A schedule (pass pipeline) cannot legally apply to a program; the message says why."""


class VerifyError(TilecError):
    """The verifier rejected a graph after a pass (a compiler bug, or an illegal forced schedule): its problems
    as located diagnostics (each `kind` the rule that found it), printed like the parser's errors, one per line
    (`file:line:col: error: ...`; render() adds the source line and a caret), and the pass after which it ran.
    `problems`: the same, one string each, without the source lines."""

    def __init__(self, pass_name: str, problems: list[Diagnostic | str], source: str | None = None):
        self.pass_name = pass_name
        self.diagnostics = [p if isinstance(p, Diagnostic) else Diagnostic(NOWHERE, p, "verifier") for p in problems]
        self.source = source
        self.problems = [d.render(None) for d in self.diagnostics]
        super().__init__("\n".join(self.problems) + "\n" + self.note)

    @property
    def note(self) -> str:
        if self.pass_name == "lower":  # before any schedule's pass: what the program says is at fault
            return "note: the verifier rejected the program as written (after pass 'lower', before any schedule's)"
        return f"note: the verifier rejected the graph after pass '{self.pass_name}'"

    def render(self) -> str:
        return "\n".join(d.render(self.source) for d in self.diagnostics) + "\n" + self.note


class ArgumentError(TilecError):
    """A runtime argument (tensor) does not match the program's declaration."""


class IndexRangeError(TilecError, IndexError):
    """A row index or count read from an i32 tensor was out of range during a call (checked on the device, or by
    the reference interpreter): the message names the tensor, the element and its value. The fields are attributes
    too (tensor, element, value, target, rank)."""

    def __init__(self, message: str, **fields):
        super().__init__(message)
        self.fields = fields
        for k, v in fields.items():
            setattr(self, k, v)
