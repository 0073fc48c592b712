"""Data-dependent rows: a row index read from an i32 tensor (`X[idx[t], :]`) and per-block valid-row counts
(`c in C by BC upto cnt[e]`).

A gathered access is an `Access` whose data-dependent dims index through the whole dim for every pass: its
`index`/`tile` there name a one-trip variable spanning the dim (as `:` does), so the regions, dependences, waits
and write checks of every pass and of the verifier cover every row the index may hit (the conservative region),
without any of them knowing about gathers. `Gathered.rows` says where the rows really come from (codegen and the
reference read it) and `Access.shape` is the real tile (the index tile's rows).

A counted loop is a `Var` with the element of an i32 tensor holding how many of its rows are valid: every access
indexed by it is masked past the count (not loaded, stored as nothing); its region is the whole extent.

Index and count tensors are inputs (`in`): they are given before a call, so no wait guards them. What cannot be
proven at compile time, that every index value is a row of its dim and every count at most its extent, is checked
at run time by every task (the first offence goes to the call's error word, the access is masked, and the host
raises `IndexRangeError` naming the tensor, the element and the value).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tilec.errors import IndexRangeError, Loc
from tilec.ir.types import Access, Load, Var, walk

INDEX_RANGE = 2  # the error word's first entry for an index or count out of range (1: a wait timed out)


@dataclass(frozen=True)
class Rows:
    """Dim `dim` of a gathered access takes its rows from the values of `index` (a 1-D i32 tile or element);
    `size` is that dim's length."""

    dim: int
    index: Access
    size: int
    loc: Loc = field(compare=False, repr=False)


@dataclass(frozen=True)
class Gathered(Access):
    """An access with data-dependent rows (see the module)."""

    rows: tuple[Rows, ...] = ()

    @property
    def vars(self) -> set[str]:
        out = super().vars
        for r in self.rows:
            out |= r.index.vars
        return out

    def row(self, dim: int) -> Rows | None:
        return next((r for r in self.rows if r.dim == dim), None)

    def __str__(self) -> str:
        at = "" if self.rank == "rank" else f"@{self.rank}"
        parts = [f"{r.index}" if (r := self.row(d)) else str(i) for d, i in enumerate(self.index)]
        return f"{self.tensor}{at}[{', '.join(parts)}]"


@dataclass(frozen=True)
class Counted(Var):
    """A tile loop whose rows past the value of `count` (an element of a 1-D i32 input) are not valid."""

    count: Access | None = None


def tile_extent(a, d: int, dom) -> int:
    """What a tile's extent in dim d must be: its tile var's step, or a gathered dim's index tile's rows."""
    row = a.row(d) if isinstance(a, Gathered) else None
    if row is not None:
        return row.index.shape[0]
    return dom[a.tile[d]].step if a.tile[d] else 1


def gathered(a) -> bool:
    return isinstance(a, Gathered)


def counted_loop(loops) -> Counted | None:
    """The first loop of a stage whose valid rows a data-dependent count bounds (`upto`), if any. Such a count is
    this rank's input: a pass that runs the stage elsewhere (a push on the sending rank), merges its tiles (a wider
    step reads one block's count for several) or reads the copy's source in its place (rows past the count were
    never copied) would change what the program means."""
    return next((v for v in loops if isinstance(v, Counted) and v.count is not None), None)


def has_gather(e) -> bool:
    """Whether a tile expression reads data-dependent rows."""
    return any(isinstance(x, Load) and gathered(x.access) for x in walk(e))


@dataclass(frozen=True)
class Check:
    """One run-time range check, numbered from 1 in program order: an index tensor's values as rows of `target`'s
    dim `dim` (0..size-1), or a count tensor's value as a count of loop `loop`'s rows (0..size)."""

    number: int
    tensor: str  # the index or count tensor
    target: str  # the gathered tensor, or the counted loop
    dim: int
    size: int
    what: str  # "index" | "count"
    loc: Loc


def checks(items) -> list[Check]:
    """Every range check of a bound program's stages (BoundProgram.items), in a fixed order shared by codegen (the
    number it records) and the host (which turns the number back into words)."""
    out: list[Check] = []
    for it in items:
        loops = getattr(it, "loops", ())
        for v in loops:
            if isinstance(v, Counted) and v.count is not None:
                out.append(Check(len(out) + 1, v.count.tensor, v.name, 0, v.extent, "count", v.count.loc))
        for st in getattr(it, "body", ()):
            accs = [st.access] + [x.access for x in walk(st.value) if isinstance(x, Load)]
            for a in accs:
                for r in getattr(a, "rows", ()):
                    out.append(Check(len(out) + 1, r.index.tensor, a.tensor, r.dim, r.size, "index", r.loc))
                    if a is st.access:  # a scatter: its rows must also be distinct
                        out.append(Check(len(out) + 1, r.index.tensor, a.tensor, r.dim, r.size, "unique", r.loc))
    return out


def claim_tensor(target: str) -> str:
    """The internal i32 buffer in which a call claims the rows it scatters into `target` (one word per row and
    element of the other dims, the call's epoch once claimed)."""
    return f"_claims_{target}"


def index_inputs(items) -> dict[str, tuple[str, int]]:
    """Tensor -> ("index" or "unique" (a scatter's: distinct), rows it may name) or ("count", the extent it counts in),
    the smallest over its uses: what
    `tilec run` draws such inputs from (counts at their extent: the rows past a count are never stored, so a later
    read of them sees what an earlier call left, which no reference can know)."""
    out: dict[str, tuple[str, int]] = {}
    for c in checks(items):
        what, n = out.get(c.tensor, (c.what, c.size))
        out[c.tensor] = ("unique" if "unique" in (what, c.what) else what, min(n, c.size))
    return out


def check_number(items, tensor: str, loc: Loc, what: str | None = None) -> int:
    """The number of the check of index or count tensor `tensor` written at `loc` (`what`: "unique" for a scatter's
    distinct rows)."""
    for c in checks(items):
        if c.tensor == tensor and (c.loc.line, c.loc.col) == (loc.line, loc.col) and (what is None or c.what == what):
            return c.number
    return 0


def range_message(items, number: int, element: int, value: int, rank: int, program: str) -> str:
    """What the host says about an index or count out of range that the device recorded."""
    c = next((c for c in checks(items) if c.number == number), None)
    if c is None:
        return f"rank {rank}: program {program}: an index was out of range (check {number}, value {value})"
    if c.what == "unique":
        return (f"rank {rank}: rows not distinct: {c.tensor}[{element}] = {value} names a row of dim {c.dim} of"
                f" '{c.target}' that another element of this call's scatter at {c.loc} also writes; only the first"
                " write of that row was stored")
    if c.what == "count":
        return (f"rank {rank}: count out of range: {c.tensor}[{element}] = {value} is not a count of the {c.size} rows"
                f" of loop '{c.target}' (0..{c.size}) at {c.loc}; those rows were not loaded or stored")
    return (f"rank {rank}: index out of range: {c.tensor}[{element}] = {value} is not a row of dim {c.dim} of"
            f" '{c.target}' (0..{c.size - 1}) at {c.loc}; that row was not read or written")


def index_range_error(prog, err: list[int], rank: int) -> IndexRangeError:
    """The host's error for a call whose error word (err: its entries) recorded an index or count out of range."""
    number, element, value = err[1:4]
    c = next((c for c in checks(prog.items) if c.number == number), None)
    return IndexRangeError(range_message(prog.items, number, element, value, rank, prog.name),
                           tensor=c.tensor if c else None, element=element, value=value,
                           target=c.target if c else None, rank=rank)
