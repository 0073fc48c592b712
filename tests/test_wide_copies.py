"""Copies of tiles too wide for a program's registers (`Y[.., :] = X@r[.., :]` over a long row): codegen moves them
in column chunks (codegen/tasks.wide_copy), one loop inside the task, the task and its flags whole. Affine copies
(an all-gather of rows) and gathers of data-dependent rows (MoE's dispatch), a row width that is a power of two and
one that is not (and a gather along the `:`, left whole), against torch at worlds 1-3 under every schedule and
transport that applies, one rank per "node" on backend nvshmem too; the chunked kernel compiles for sm_90 without
spilling."""

from __future__ import annotations

import pytest
import torch

import tilec
from tests import _workers
from tests._util import check_close
from tilec.codegen.tasks import COPY_TILE_ELEMENTS
from tilec.errors import ScheduleError
from tilec.passes.schedules import SCHEDULES
from tilec.run_vs_reference import call_inputs, compare_calls
from tilec.runtime import spawn

pytestmark = pytest.mark.usefixtures("no_shm_leftovers")

# every rank's rows of A gathered whole (a BM x N tile per task), then used
GATHER = """program wide_ag(world W)
  dims  M = 32, N = {N}
  tiles BM = 16

  in  A : f32[M, N] symmetric
  buf G : f32[W*M, N] symmetric
  out C : f32[W*M, N]

  stage gather over r in ranks, m in M by BM:
    G[r*M + m, :] = A@r[m, :]
  barrier
  stage use over q in W*M by BM, n in N by 64:
    C[q, n] = G[q, n] * 2
"""

# rows of every rank's X chosen by an index (a dispatch), then used
ROWS = """program wide_rows(world W)
  dims  T = 24, N = {N}, S = 32
  tiles BS = 16

  in  X   : f32[T, N] symmetric
  in  idx : i32[W*S]
  buf Xd  : f32[W*S, N]
  out Y   : f32[W*S, N]

  stage take over r in ranks, j in S by BS:
    Xd[r*S + j, :] = X@r[idx[r*S + j], :]
  barrier
  stage use over q in W*S by BS, n in N by 64:
    Y[q, n] = Xd[q, n] + 1
"""


# columns chosen by an index: the `:` is the gathered dim, whose positions are not a range to chunk (left whole)
COLS = """program wide_cols(world W)
  dims  M = 32, N = {N}
  tiles BM = 16

  in  X   : f32[M, N]
  in  idx : i32[N]
  out Y   : f32[M, N]

  stage pick over m in M by BM:
    Y[m, :] = X[m, idx[:]]
"""


# the wide copy reads what the stage before wrote, tile by tile (column tiles of BN): under flags its task waits on
# every column tile's counter of the row block, which a wait planned on one chunk would cut short
CHAIN = """program wide_chain(world W)
  dims  M = 32, N = {N}
  tiles BM = 16, BN = 64

  in  A : f32[M, N] symmetric
  buf P : f32[M, N] symmetric
  buf G : f32[W*M, N]
  out C : f32[W*M, N]

  stage make over m in M by BM, n in N by BN:
    P[m, n] = A[m, n] * 3
  barrier
  stage gather over r in ranks, m in M by BM:
    G[r*M + m, :] = P@r[m, :]
  barrier
  stage use over q in W*M by BM, n in N by BN:
    C[q, n] = G[q, n] + 1
"""


def _want(name: str, ins: list[dict[str, torch.Tensor]], r: int) -> dict[str, torch.Tensor]:
    if name == "wide_chain":
        return {"C": torch.cat([d["A"] for d in ins]) * 3 + 1}
    if name == "wide_cols":
        return {"Y": ins[r]["X"][:, ins[r]["idx"].long()]}
    if name == "wide_ag":
        return {"C": torch.cat([d["A"] for d in ins]) * 2}
    s = ins[0]["idx"].numel() // len(ins)
    idx = ins[r]["idx"].long()
    return {"Y": torch.cat([ins[o]["X"][idx[o * s:(o + 1) * s]] for o in range(len(ins))]) + 1}


@pytest.mark.parametrize("n", [2048, 1500])  # a power of two, and a row whose last chunk overhangs
def test_wide_copies_are_chunked(n):
    for text, stage in ((GATHER, "gather"), (ROWS, "take")):
        prog = tilec.compile("wide.tile", world=2, schedule="bsp", source=text.format(N=n))
        assert 16 * n > COPY_TILE_ELEMENTS
        copy = prog.source[prog.source.index(f"def k0_{stage}("):prog.source.index("def k1_use(")]
        assert "for _a" in copy and "columns at a time" in copy, copy
    narrow = tilec.compile("wide.tile", world=2, schedule="bsp", source=GATHER.format(N=512))  # 16 x 512: whole
    assert "columns at a time" not in narrow.source
    cols = tilec.compile("wide.tile", world=2, schedule="bsp", source=COLS.format(N=n))
    assert "columns at a time" not in cols.source


@pytest.mark.parametrize("schedule", ["flags", "fused-push"])
def test_emitted_chunked_copy(schedule, golden):
    """The chunked copy as a reader sees it: the chain's gather under flags (it waits on every column tile's
    counter first, then copies 1024 columns at a time) and the all-gather under fused-push (a push into the peer's
    rows, the last chunk masked, the flag released after the chunks)."""
    text, name = (CHAIN, "chain") if schedule == "flags" else (GATHER, "gather")
    prog = tilec.compile(f"wide_{name}.tile", world=2, schedule=schedule, source=text.format(N=1500))
    golden(f"wide_copies/{name}_w2_{schedule}.source.py", prog.source)


@pytest.mark.parametrize("world", [2, 3])
def test_chunking_changes_no_wait(world, monkeypatch):
    """Every flag wait of a chunked copy is the whole tile's: the same wait lines as the program with its copies
    left whole, under every schedule (a wait planned while the chunk was in scope covered the first chunk's columns
    only, and the MoE's return under `specialized` read rows not yet written)."""
    import tilec.codegen.tasks as tasks

    def waits(src: str) -> list[str]:
        return sorted(line.strip() for line in src.splitlines() if "wait" in line and "td." in line)

    seen = 0
    for schedule in SCHEDULES:
        for n in (2048, 1500):
            text = CHAIN.format(N=n)
            try:
                chunked = tilec.compile("wide.tile", world=world, schedule=schedule, source=text).source
            except ScheduleError:
                continue
            with monkeypatch.context() as m:
                m.setattr(tasks, "COPY_TILE_ELEMENTS", 1 << 40)
                whole = tilec.compile("wide.tile", world=world, schedule=schedule,
                                      source=text + "# copies left whole\n").source
            assert "columns at a time" in chunked and "columns at a time" not in whole
            assert waits(chunked) == waits(whole), (schedule, n)
            seen += bool(waits(whole))
    assert seen >= 4  # flags, fused-push, specialized wait (at both widths)


@pytest.mark.parametrize("world, per_node, n", [(1, None, 1500), (2, None, 2048), (3, None, 1500), (2, 1, 1500)])
def test_wide_copies_match_torch_under_every_schedule(world, per_node, n):
    """per_node: backend nvshmem with that many ranks per node (the copies' peers off the node); n: the row width."""
    nodes = {"backend": "nvshmem", "ranks_per_node": per_node} if per_node else {}
    batch, meta = [], {}
    for text in (GATHER, ROWS, COLS, CHAIN):
        for schedule in SCHEDULES:
            for transport in ("sm", "dma"):
                try:
                    prog = tilec.compile("wide.tile", world=world, schedule=schedule, transport=transport,
                                         source=text.format(N=n), **nodes)
                except ScheduleError:
                    continue
                calls = call_inputs(prog, 2, seed=world + n)
                key = f"{prog.program.name} N={n} {schedule}+{transport}"
                batch.append((key, prog, calls, ()))
                meta[key] = (prog, calls)
    assert {f"wide_ag N={n} bsp+sm", f"wide_rows N={n} flags+sm"} <= set(meta), sorted(meta)
    got = spawn(_workers.run_cases, world, heap_bytes=1 << 25, timeout=900, args=(batch,))
    for key, (prog, calls) in meta.items():
        for i, per_rank in enumerate(calls):
            for r in range(world):
                for name, want in _want(prog.program.name, per_rank, r).items():
                    check_close(got[r][key][i][name], want, "f32", f"{key} w{world} call {i} rank {r} {name}")
        bad = [row for row in compare_calls(prog, [got[r][key] for r in range(world)], calls) if not row.ok]
        assert not bad, (key, bad[:3])


def test_the_chunked_copy_does_not_spill_on_sm90():
    """The MoE dispatch's shape (128 rows of 2048 f16 per task): whole, the kernel spilled 11840 bytes per thread
    on sm_90; in chunks, none."""
    from tilec.codegen.target_check import compile_for_target

    text = ROWS.replace("f32", "f16").replace("S = 32", "S = 256").replace("BS = 16", "BS = 128")
    prog = tilec.compile("wide.tile", world=2, schedule="bsp", source=text.format(N=2048))
    built = {b.kernel: b for b in compile_for_target(prog, "cuda:90")}
    take = next(b for k, b in built.items() if "take" in k)
    if take.spilled is None:
        pytest.skip("no cuobjdump beside Triton: spills unknown")
    assert take.spilled == 0, take.describe()
