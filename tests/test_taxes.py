"""`tilec taxes`: exact static accounting per schedule (numbers worked out by hand), the cost model against the
measured H200 bench, and the command line. CPU only, no rank processes."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

import tilec
from tests._util import ROOT
from tilec.cli.taxes import add_parser, main
from tilec.errors import TilecError
from tilec.passes.schedules import SCHEDULES
from tilec.perf.auto import rank_schedules
from tilec.perf.model import Machine, calibrate, predict
from tilec.perf.taxes import Skipped, gpu_count, static, taxes

AG = str(ROOT / "examples" / "ag_gemm.tile")
PROGRAMS = ROOT / "tests" / "programs"
SMALL = {"M": 256, "N": 192, "K": 128}  # tiles BM=64 BN=64 BK=32 (the file's defaults)


def by_schedule(rows) -> dict:
    return {r.schedule: r for r in rows}


@pytest.fixture(scope="module")
def ag_w2() -> dict:
    return by_schedule(taxes(AG, 2, SMALL, granularity="tile"))  # the hand counts below are per producer tile


# -- static accounting, by hand ---------------------------------------------------------------------
# world 2, M=256 N=192 K=128, f16: Ag = 256*128*2 = 65536 B; A shard = 32768 B; the gemm has 4*3 = 12 tasks of
# 64x64, each reading a 64x128 Ag row block (16384 B), so Ag is read back 3 times (once per N-tile column).
AG_BYTES, A_SHARD, GEMM_FLOPS = 65536, 32768, 2 * 256 * 192 * 128


def test_bsp_static(ag_w2):
    r = ag_w2["bsp"]
    assert (r.launches, r.barriers, r.barriers_entry, r.barriers_between, r.barriers_exit) == (2, 2, 1, 1, 0)
    assert r.roundtrip_tensors == ("Ag",) and r.intra_roundtrip_tensors == ()
    assert r.roundtrip_write_bytes == AG_BYTES
    assert r.roundtrip_read_bytes == 3 * AG_BYTES and r.roundtrip_unique_read_bytes == AG_BYTES
    assert r.roundtrip_bytes == 4 * AG_BYTES
    assert r.remote_read_bytes == A_SHARD and r.remote_write_bytes == 0  # the peer's shard, once
    assert (r.flag_releases, r.flag_waits, r.flops) == (0, 0, GEMM_FLOPS)


def test_flags_static(ag_w2):
    r = ag_w2["flags"]
    assert (r.launches, r.barriers, r.barriers_between, r.barriers_exit) == (2, 2, 0, 1)  # peers read A to the end
    # local-in-place: only the peer's rows go through Ag (written once, read once per N column), this rank's are
    # read from A in place
    assert r.roundtrip_tensors == ("Ag",) and r.roundtrip_bytes == 2 * AG_BYTES
    assert r.roundtrip_write_bytes == AG_BYTES // 2 and r.roundtrip_read_bytes == 3 * AG_BYTES // 2
    assert r.remote_read_bytes == A_SHARD
    # the peer x 2 m-tiles x 4 k-tiles gather tasks release one counter each; every gemm task over the peer's rows
    # waits for the 1 row tile x 4 k tiles it reads, the 4 k counters polled as one block: one poll round each
    assert (r.flag_releases, r.flag_waits) == (8, 6)
    assert [k.share for k in r.kernel_costs] == [0.5, 0.5]


def test_fused_pull_static(ag_w2):
    r = ag_w2["fused-pull"]
    assert (r.launches, r.barriers, r.barriers_exit) == (1, 2, 1)
    assert r.roundtrip_bytes == 0 and r.roundtrip_tensors == () and r.intra_roundtrip_bytes == 0
    # every gemm task pulls its 64x128 A rows; half of all rows live on the other rank; re-read per N column
    assert r.remote_read_bytes == 3 * AG_BYTES // 2 and r.remote_write_bytes == 0
    assert (r.flag_releases, r.flag_waits) == (0, 0)


def test_fused_push_static(ag_w2):
    """The inbox Ag is written and read inside one kernel: counted, labelled intra-kernel, not inter-kernel."""
    r = ag_w2["fused-push"]
    assert (r.launches, r.barriers, r.barriers_exit) == (1, 1, 0)
    assert r.roundtrip_bytes == 0 and r.roundtrip_tensors == ()
    assert r.intra_roundtrip_tensors == ("Ag",) and r.intra_roundtrip_bytes == 2 * AG_BYTES  # the peer's rows only
    assert r.remote_read_bytes == 0 and r.remote_write_bytes == A_SHARD  # my shard pushed to the peer
    assert (r.flag_releases, r.flag_waits) == (8, 6)  # as flags: one block of 4 k counters per gemm task
    # Ag fits L2, so the model charges no locality tax for it
    assert r.locality_tax_us == 0


def test_ragged_tiles_are_counted_exactly():
    """world 3, M=99 (33 rows per rank), N=72, K=40 with 64x64x32 tiles: masked tiles count only real elements."""
    rows = by_schedule(taxes(AG, 3, {"M": 99, "N": 72, "K": 40}, granularity="tile"))
    ag = 99 * 40 * 2
    bsp = rows["bsp"]
    assert bsp.roundtrip_write_bytes == ag and bsp.roundtrip_read_bytes == 2 * ag  # 2 N-tile columns
    assert bsp.remote_read_bytes == ag * 2 // 3
    assert bsp.flops == 4 * 2 * (2 * 64 * 64 * 32)  # 4 padded output tiles x 2 k steps: what the GPU executes
    # a 64-row tile straddles two ranks' shards: 2 row counters (one block) x 2 k counters per gemm task
    assert rows["flags"].flag_waits == 4 * 2 and rows["flags"].flag_releases == 3 * 1 * 2
    assert rows["fused-pull"].remote_read_bytes == 2 * ag * 66 // 99


def test_reduction_over_ranks_and_repeated_reads():
    rs = by_schedule(taxes(str(PROGRAMS / "gemm_rs.tile"), 4))
    p_bytes = 64 * 48 * 4
    assert rs["bsp"].roundtrip_write_bytes == p_bytes
    assert rs["bsp"].roundtrip_read_bytes == 4 * p_bytes  # every rank's partial P@r, summed
    assert rs["bsp"].remote_read_bytes == 3 * p_bytes
    assert rs["flags"].flag_waits == 6 * 4  # 6 reduce tasks wait on each rank's counter
    assert rs["flags"].stage_costs[1].remote_flag_waits == 6 * 3
    assert isinstance(rs["fused-pull"], Skipped) and "copy" in rs["fused-pull"].skipped
    ew = by_schedule(taxes(str(PROGRAMS / "elementwise.tile"), 2))["flags"]
    t_bytes = 40 * 24 * 4  # T is read three times in a task: one load, one wait
    assert ew.roundtrip_write_bytes == ew.roundtrip_read_bytes == t_bytes
    # Y's and T's tiles are counted by one flag of `first` (one release per task, after both stores): one wait
    assert ew.flag_waits == 9 and ew.flag_releases == 9
    src = tilec.compile(str(PROGRAMS / "elementwise.tile"), world=2, schedule="flags").source
    assert src.count("td.wait(F_") == 1 and "td.wait(F_T_first" not in src
    assert ew.remote_read_bytes == ew.remote_write_bytes == 0


def test_compiled_program_and_pandas_friendly_rows(ag_w2):
    prog = tilec.compile(AG, world=2, schedule="fused-pull", dims=SMALL)
    assert static(prog).remote_read_bytes == ag_w2["fused-pull"].remote_read_bytes
    rows = by_schedule(taxes(prog))
    assert rows["bsp"].roundtrip_bytes == ag_w2["bsp"].roundtrip_bytes
    d = dataclasses.asdict(rows["bsp"])
    assert d["launches"] == 2 and d["predicted_us"] > 0 and d["measured_us"] is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        rows["bsp"].launches = 3
    with pytest.raises(TilecError, match="world 2"):
        taxes(prog, world=4)


# -- the model --------------------------------------------------------------------------------------


def test_prediction_adds_up(ag_w2):
    for r in ag_w2.values():
        parts = r.overlap_us + r.bsp_tax_us + r.locality_tax_us + r.launch_tax_us + r.flag_wait_us
        assert r.predicted_us == pytest.approx(parts)
        assert r.launch_tax_us == pytest.approx(r.launches * 11.0)
        assert r.barrier_us == pytest.approx(r.barriers * Machine().barrier_us)


@pytest.fixture(scope="module")
def recorded_world1() -> list[tuple[dict, float]]:
    """tests/data/h200_ag_gemm_eager_events.json (the world-1 bench of 2026-11-29,
    timed as events around eager calls, which is what the model predicts): every tilec row of the recorded All-Gather +
    GEMM bench with the model's prediction for it (the bench calls without entry barrier; bf16 has f16's sizes)."""
    data = json.loads((ROOT / "tests/data/h200_ag_gemm_eager_events.json").read_text())
    out = []
    for row in data["rows"]:
        if row["kind"] != "tilec":
            continue
        cfg = {k: row["config"][k] for k in ("BM", "BN", "BK")}
        prog = tilec.compile(AG, world=1, schedule=row["name"], dims={**row["shape"], **cfg})
        out.append((row, predict(static(prog), Machine(), entry_barrier=False).predicted_us))
    return out


def test_model_matches_the_measured_world1_bench(recorded_world1):
    """On the M=8192 shapes the model is within 15% of the measured bsp, fused-pull and fused-push calls and within
    25% of flags and specialized. Before remote stores went through one peer offset per task, fused-push measured
    1.2-2.4x its prediction: each copy tile took 16.4 us instead of 1.6 us."""
    # recorded before local-in-place: at world 1 flags and fused-push no longer copy A (the GEMM reads it in place),
    # so their recorded times are of other programs (re-record with `tilec bench --world 1`)
    tolerance = {"bsp": 0.15, "fused-pull": 0.15, "specialized": 0.25}
    checked = 0
    for row, pred in recorded_world1:
        s = row["shape"]
        if row["name"] not in tolerance or s["M"] < 8192:
            continue
        tol = tolerance[row["name"]]
        assert 1 - tol < pred / row["median_us"] < 1 + tol, (s, row["name"], pred, row["median_us"])
        checked += 1
    assert checked == 15


def test_model_ranks_schedules_as_measured(recorded_world1):
    """The same recorded run, every shape (the 1024-row one too): the model's pick is the fastest measured
    schedule, and every pair of schedules whose measured times differ by more than 5% is ordered the same way by
    the model (on 8192x3584x14336 it swaps bsp and fused-push, measured 0.4% apart)."""
    by_shape: dict[tuple, dict[str, tuple[float, float]]] = {}
    for row, pred in recorded_world1:
        if row["name"] in ("flags", "fused-push"):  # recorded before local-in-place (see above)
            continue
        by_shape.setdefault(tuple(row["shape"].values()), {})[row["name"]] = (pred, row["median_us"])
    assert len(by_shape) == 6
    for shape, times in by_shape.items():
        assert len(times) == 3, shape
        assert min(times, key=lambda n: times[n][0]) == min(times, key=lambda n: times[n][1]), (shape, times)
        for a in times:
            for b in times:
                (pa, ma), (pb, mb) = times[a], times[b]
                if ma * 1.05 < mb:
                    assert pa < pb, (shape, a, b, times)


BENCH_TILES = {"BM": 128, "BN": 256, "BK": 64}


def test_ranking_world8():
    # communication-bound (small N): bsp pays gather + GEMM back to back, the fused schedules overlap them
    ranked = rank_schedules(AG, 8, {"M": 8192, "N": 1024, "K": 8192, **BENCH_TILES})
    names = [s for s, _ in ranked]
    assert names.index("fused-push") < names.index("bsp")
    assert [t for _, t in ranked] == sorted(t for _, t in ranked)
    rows = by_schedule(taxes(AG, 8, {"M": 8192, "N": 1024, "K": 8192, **BENCH_TILES}))
    assert rows["bsp"].serialization_us > 0 and rows["fused-push"].serialization_us == 0
    # a big shape: with per-rank flags the fused push beats bsp; fused-pull re-reads remote A once per N-tile
    # column (72x with BN=64), so its link traffic exceeds the all-gather's
    big = {"M": 8192, "N": 4608, "K": 36864}
    rows = by_schedule(taxes(AG, 8, big, granularity="rank"))
    assert rows["fused-push"].predicted_us < rows["bsp"].predicted_us
    assert rows["fused-pull"].remote_read_bytes == 72 * rows["bsp"].remote_read_bytes
    assert rows["bsp"].bsp_share > rows["fused-push"].bsp_share


def test_specialized_stages_run_side_by_side():
    """Workgroup specialization: each stage on its own share of the programs (the GEMM on 3/4 of them here)."""
    if "specialized" not in SCHEDULES:
        pytest.skip("no specialized schedule in this compiler")
    rows = by_schedule(taxes(AG, 8, {"M": 8192, "N": 4608, "K": 36864, **BENCH_TILES}, granularity="rank"))
    spec, push = rows["specialized"], rows["fused-push"]
    groups = spec.kernel_costs[0].groups
    assert len(groups) == 2 and sum(groups) == pytest.approx(1.0)
    assert spec.compute_us == pytest.approx(push.compute_us / groups[1], rel=0.02)


def test_machine_json_roundtrip(tmp_path):
    m = Machine(name="test box", barrier_us=42.0)
    m.save(tmp_path / "m.json")
    assert Machine.load(tmp_path / "m.json") == m
    (tmp_path / "bad.json").write_text('{"warp_speed": 9}')
    with pytest.raises(TilecError, match="unknown field"):
        Machine.load(tmp_path / "bad.json")


@pytest.mark.skipif(gpu_count() > 0, reason="checks the CPU-only message")
def test_calibrate_needs_a_gpu():
    with pytest.raises(TilecError, match="measures a GPU"):
        calibrate(log=lambda *_: None)


# -- the command line ------------------------------------------------------------------------------


def test_cli_table(capsys, tmp_path):
    Machine(name="my box").save(tmp_path / "m.json")
    rc = main(["taxes", AG, "--world", "2", "-D", "M=256", "-D", "N=192", "-D", "K=128",
               "--machine", str(tmp_path / "m.json")])
    out = capsys.readouterr().out
    assert rc == 0
    assert "machine: my box" in out and "static accounting" in out and "predicted" in out
    for s in ("bsp", "flags", "fused-pull", "fused-push"):
        assert f"\n{s:<12}" in out
    assert "Ag (intra)" in out and "2 = 1+1+0" in out and "fastest predicted:" in out


def test_cli_via_add_parser_and_skips(capsys):
    ap = argparse.ArgumentParser()
    add_parser(ap.add_subparsers(dest="cmd"))
    args = ap.parse_args(["taxes", str(PROGRAMS / "elementwise.tile"), "-w", "2"])
    assert args.fn(args) == 0
    out = capsys.readouterr().out
    assert "fused-pull  skipped: fused-pull does not apply" in out


@pytest.mark.skipif(gpu_count() > 0, reason="checks the CPU-only message")
def test_cli_measure_without_gpu(capsys):
    assert main(["taxes", AG, "-w", "2", "--measure"]) == 0
    assert "measured: needs a CUDA GPU" in capsys.readouterr().out


def test_cli_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "taxes.png"
    assert main(["taxes", AG, "-w", "2", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_errors(capsys):
    assert main(["taxes", "no/such.tile"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_shared_fold_waits_are_counted():
    """A folded stage's shared groups wait once per sharing arrival but the last (codegen/flags.fold_share), where
    the kernel's tasks all have programs (an H200's 264 here): flash decode at 16 KV heads, 16 splits of 512 keys,
    8 merges a KV head -> 16 groups x 7 waits; with 64 splits a head (1024 tasks) the last arrival runs them all
    and nothing waits; specialized kernels (program groups) never share."""
    from tilec.perf.taxes import static

    dims = dict(B=1, HKV=16, G=8, D=128, S=8192, BS=512)
    prog = tilec.compile("examples/flash_decode.tile", world=1, schedule="fused-push", dims=dims)
    assert "td.arrive_left(" in prog.source and static(prog).flag_waits == 16 * 7
    assert static(tilec.compile("examples/flash_decode.tile", world=1, schedule="fused-push",
                                dims={**dims, "BS": 128})).flag_waits == 0
    assert static(tilec.compile("examples/flash_decode.tile", world=1, schedule="specialized",
                                dims=dims)).flag_waits == 0
