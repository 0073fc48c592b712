"""The cost model knows the copy engines: dma stages cost their chunks beside the kernels, SM copies in a
fused kernel hold their programs, and `--schedule auto` picks the transport with the schedule. CPU only: the
numbers are the model's (tilec.perf.model), checked against arithmetic done here by hand."""

import json
from dataclasses import asdict, replace
from types import SimpleNamespace

import pytest

import tilec
from tilec import settings
from tilec.cli import main
from tilec.ir.graph import DMA, stages
from tilec.perf import auto
from tilec.perf.model import Machine, copy_engine_us, predict
from tilec.perf.taxes import CopyChunk, gpu_count, static

AG = "examples/ag_gemm.tile"
# compute-heavy at world 2: the SM gather's link time shows in fused-push, the copy engines' hides under the GEMM
BIG = {"M": 4096, "N": 4608, "K": 8192, "BM": 128, "BN": 256, "BK": 64}
FAST_CE = Machine(ce_GBps=1e12, ce_link_GBps=1e12, ce_latency_us=0.0)  # copies that cost nothing


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEC_CACHE", str(tmp_path))  # the auto cache's key ignores tiles: one per test


def _ce(*chunks) -> SimpleNamespace:
    return SimpleNamespace(copy_engine_chunks=(tuple(chunks),))


def test_copy_engine_time_is_bytes_over_rate_plus_latency_per_issued_copy():
    m = Machine(ce_GBps=1000.0, ce_link_GBps=100.0, ce_latency_us=5.0)
    local = CopyChunk(stream=0, bytes=10_000_000, peer=False, copies=2)  # 10 us of copy + 2 issued copies
    far = CopyChunk(stream=1, bytes=10_000_000, peer=True, copies=2)  # 100 us over the link
    assert copy_engine_us(_ce(local), m) == pytest.approx(10 + 2 * 5)
    assert copy_engine_us(_ce(far), m) == pytest.approx(100 + 2 * 5)
    # more bytes, more time; one more chunk on a stream, one more latency per issued copy
    assert copy_engine_us(_ce(replace(far, bytes=20_000_000)), m) == pytest.approx(200 + 2 * 5)
    assert copy_engine_us(_ce(far, replace(far, bytes=0, copies=1)), m) == pytest.approx(100 + 3 * 5)
    # the local and the peer's stream run at once: the slower one sets the time
    assert copy_engine_us(_ce(local, far), m) == pytest.approx(110)
    # two peers' streams share the link
    two = (replace(far, stream=1, copies=0), replace(far, stream=2, copies=0))
    assert copy_engine_us(_ce(*two), m) == pytest.approx(200)
    assert copy_engine_us(SimpleNamespace(copy_engine_chunks=()), m) == 0.0


def test_static_keeps_each_ranks_chunks_as_runtime_issues_them():
    prog = tilec.compile(AG, 2, "flags", BIG, transport="dma")
    st = static(prog)
    assert st.copy_engine_stages == ("gather",) and st.copy_engine_consumers == ("gemm",)
    assert len(st.copy_engine_chunks) == 2
    for chunks in st.copy_engine_chunks:
        # every rank gathers the peer's 2048 rows of Ag (f16) over the link, on the peer's stream; its own rows the
        # GEMM reads in place (local-in-place)
        assert sum(c.bytes for c in chunks) == 2048 * 8192 * 2
        assert all(c.peer for c in chunks)
        assert len({c.stream for c in chunks}) == 1
        assert all(c.copies >= 2 for c in chunks)  # a copy and the flag's 4-byte copy
    (ag,) = st.roundtrips
    assert ag.ce_write_bytes == ag.write_bytes  # the copy engines write Ag: no locality tax for the writes
    sm = static(tilec.compile(AG, 2, "flags", BIG))
    assert sm.copy_engine_chunks == () and sm.roundtrips[0].ce_write_bytes == 0


def test_predict_overlaps_the_copy_engines_with_the_kernels():
    st = static(tilec.compile(AG, 2, "fused-push", BIG, transport="dma"))
    free = predict(st, FAST_CE)
    hidden = predict(st, Machine(ce_latency_us=1.0))  # the copies take much less time than the GEMM
    assert 0 < hidden.copy_engine_us < hidden.compute_us
    assert hidden.copy_engine_exposed_us == 0.0
    assert hidden.predicted_us == pytest.approx(free.predicted_us, rel=1e-9)  # a shorter copy adds nothing
    slow = predict(st, Machine(ce_link_GBps=20.0))  # now the link copy outlasts the GEMM and sets the time
    assert slow.copy_engine_us > slow.compute_us
    chunks = len(st.copy_engine_chunks[0])
    last = slow.compute_us / chunks  # the consumer's work on the last chunk
    assert slow.copy_engine_exposed_us == pytest.approx(slow.copy_engine_us + last - slow.compute_us, rel=1e-6)
    taxes = slow.bsp_tax_us + slow.locality_tax_us + slow.launch_tax_us + slow.flag_wait_us
    assert slow.predicted_us == pytest.approx(slow.copy_engine_us + last + taxes, rel=1e-6)
    # more latency per issued copy, more time
    slower = predict(st, Machine(ce_link_GBps=20.0, ce_latency_us=8.0))
    issued = max(sum(c.copies for c in cs) for cs in st.copy_engine_chunks)  # one stream a rank: the peer's
    assert slower.predicted_us - slow.predicted_us == pytest.approx((8.0 - Machine().ce_latency_us) * issued, rel=1e-6)


def test_sm_copies_in_a_fused_kernel_hold_their_programs():
    """fused-push runs its gather tasks, then its GEMM tasks: the push's link time is not hidden under the GEMM."""
    st = static(tilec.compile(AG, 2, "fused-push", BIG))
    p = predict(st, Machine())
    link = (st.remote_read_bytes + st.remote_write_bytes) / (Machine().link_GBps * 1e3)
    gather = next(c for c in st.stage_costs if c.name == "gather")
    assert gather.remote_write_bytes > 0 and p.sm_copy_us > 0
    assert p.sm_copy_us == pytest.approx(link - (p.compute_us - _gemm_us(st)), rel=1e-6)  # link - gather's compute
    # bsp's copy has a kernel of its own: its cost is the serialization (BSP tax), no SM copy term
    assert predict(static(tilec.compile(AG, 2, "bsp", BIG))).sm_copy_us == 0.0


def _gemm_us(st) -> float:
    from tilec.perf.model import _compute_us

    return _compute_us(next(c for c in st.stage_costs if c.name == "gemm"), Machine(), 1.0)


def test_machine_file_without_copy_engine_fields_loads(tmp_path):
    old = {k: v for k, v in asdict(Machine(name="old box", barrier_us=42.0)).items() if not k.startswith("ce_")}
    (tmp_path / "old.json").write_text(json.dumps(old))
    m = Machine.load(tmp_path / "old.json")
    assert m.barrier_us == 42.0 and m.name == "old box"
    assert (m.ce_GBps, m.ce_link_GBps, m.ce_latency_us) == (Machine().ce_GBps, Machine().ce_link_GBps,
                                                            Machine().ce_latency_us)
    new = Machine(ce_GBps=1234.0, ce_link_GBps=321.0, ce_latency_us=3.5)
    new.save(tmp_path / "new.json")
    assert Machine.load(tmp_path / "new.json") == new


def test_rank_schedules_lists_dma_variants():
    ranked = dict(auto.rank_schedules(AG, 2))
    assert {"flags+dma", "fused-push+dma"} <= set(ranked)
    assert "bsp+dma" not in ranked and "fused-pull+dma" not in ranked  # no flags / no copy stage left
    assert all(0 < t < float("inf") for t in ranked.values())


def test_auto_picks_dma_where_the_copies_hide_under_the_gemm():
    ranked = auto.rank_schedules(AG, 2, BIG)
    assert ranked[0][0].endswith("+dma")
    d = dict(ranked)
    assert d["fused-push+dma"] < d["fused-push"]  # fused-push's SM gather shows (sm_copy_us)
    # the arithmetic decides: copy engines slow enough to outlast the GEMM lose to the SMs
    assert not auto.rank_schedules(AG, 2, BIG, Machine(ce_link_GBps=40.0))[0][0].endswith("+dma")


def test_auto_keeps_the_sms_where_copy_latency_dominates():
    ranked = auto.rank_schedules(AG, 2)  # 256 x 192 x 128: microseconds of work, a few us per issued copy
    assert not ranked[0][0].endswith("+dma")
    # without the per-copy latency the dma variant would win: the latency term is what decides here
    assert auto.rank_schedules(AG, 2, None, FAST_CE)[0][0].endswith("+dma")


def test_compile_auto_builds_the_picked_transport():
    prog = auto.compile_auto(AG, 2, BIG)
    assert auto.variant_of(prog) == prog.candidates[0]["schedule"] == "fused-push+dma"
    assert {st.name for st in stages(prog.graph) if st.transport == DMA} == {"gather"}
    names = [r["schedule"] for r in prog.candidates]
    assert any(n.endswith("+dma") for n in names) and any("+" not in n for n in names)
    sm = auto.compile_auto(AG, 2, BIG, transport="sm")  # only SM variants
    assert sm.schedule == "fused-push" and not any(st.transport == DMA for st in stages(sm.graph))
    only = auto.compile_auto(AG, 2, BIG, schedule="flags")  # transport=auto for a named schedule
    assert auto.variant_of(only) == "flags+dma"


@pytest.mark.parametrize("program,schedule,transport,says", [
    # the named schedule does not apply at all: its own reason, as a plain compile gives it
    ("examples/ring_reduce_scatter.tile", "fused-pull", "auto", "fused-pull does not apply: "),
    ("examples/ring_reduce_scatter.tile", "fused-push", "dma", "fused-push does not apply: "),
    # it applies, but not on the copy engines: the transport's reason
    ("examples/flash_decode.tile", "fused-push", "dma", "transport=dma: no copy stage can run on the copy engines"),
])
def test_a_named_schedule_that_auto_cannot_place_says_why(program, schedule, transport, says):
    from tilec.errors import ScheduleError

    with pytest.raises(ScheduleError) as ei:
        auto.compile_auto(program, 2, schedule=schedule, transport=transport)
    assert str(ei.value).startswith(says) and "--schedule auto" not in str(ei.value), str(ei.value)


def test_measured_dma_variant_wins_and_old_cache_entries_are_not_misread(tmp_path):
    src = open(AG).read()
    dims = {"M": 256, "N": 192, "K": 128}
    k = auto.key(src, 2, dims)
    # an entry written before transports were ranked: its "predicted" (schedules only) is not read
    (tmp_path / "auto.json").write_text(json.dumps({k: {"predicted": {"bsp": 1.0}, "measured": {"bsp": 500.0}}}))
    rows = auto.candidates(AG, src, 2, dims, dims)
    names = {r["schedule"] for r in rows}
    assert "flags+dma" in names and "fused-push" in names
    assert next(r for r in rows if r["schedule"] == "bsp")["measured_us"] == 500.0  # measured times kept
    assert rows[0]["schedule"] == "fused-push"  # the model's pick while some variant lacks a time
    for r in rows:
        auto.record_measured(k, r["schedule"], 10.0 if r["schedule"] == "flags+dma" else 100.0)
    assert auto.candidates(AG, src, 2, dims, dims)[0]["schedule"] == "flags+dma"
    assert auto.variant_of(auto.compile_auto(AG, 2, dims)) == "flags+dma"
    assert "predicted" in json.loads((tmp_path / "auto.json").read_text())[k]  # the old field is left alone


def test_times_measured_with_other_options_have_a_key_of_their_own():
    src = open(AG).read()
    dims = {"M": 256, "N": 192, "K": 128}
    default = auto.key(src, 2, dims)
    assert default == auto.key(src, 2, dims, options=settings.Options())  # the default key is unchanged
    off = auto.key(src, 2, dims, kernels={"fold": False})  # `tilec bench --fold off` compiles without fold-last
    assert off != default and "fold=off" in off
    assert off == auto.key(src, 2, dims, options=settings.options(fold=False))
    nv = auto.key(src, 2, dims, kernels={"backend": "nvshmem", "ranks_per_node": 1, "fold": False})
    assert nv.startswith(off) and nv.endswith("|nvshmem/rpn=1")  # the options and the backend, each once


def test_cli_names_the_picked_transport(capsys):
    argv = ["show", AG, "-w", "2", *(x for d, v in BIG.items() for x in ("-D", f"{d}={v}"))]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert "auto picked fused-push+dma" in err and "copy engines" in err
    assert "[transport dma]" in out
    assert main([*argv, "--transport", "sm"]) == 0
    out, err = capsys.readouterr()
    assert "auto picked fused-push " in err and "[transport dma]" not in out
    assert main(["taxes", AG, "-w", "2", "--transport", "dma", *argv[4:]]) == 0
    out = capsys.readouterr().out
    assert "copy engines:" in out and "side stream" in out
    assert main(["show", AG, "-w", "2", "--schedules", *argv[4:]]) == 0
    assert "fused-push+dma" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.skipif(gpu_count() == 0, reason="needs a CUDA GPU")
def test_calibrate_measures_the_copy_engine():
    import torch

    from tilec.perf.model import _copy_engine

    gbps, lat = _copy_engine(torch, torch.device("cuda", 0))
    assert 100 < gbps < 10_000 and 0.1 < lat < 100


def test_bench_auto_row_times_the_picked_variant():
    from tilec.perf.bench import auto_picks
    from tilec.perf.measure import CPU_KEY

    picks = auto_picks(AG, [(256, 192, 128), (4096, 4608, 8192)], 2, CPU_KEY)
    assert picks[(256, 192, 128)] == "fused-push"
    assert picks[(4096, 4608, 8192)].endswith("+dma")  # the program's own tiles (64 x 64 x 32) at this shape


def test_auto_ranks_for_the_machine_file_tilec_machine_names(tmp_path, monkeypatch):
    dims = {"M": 256, "N": 192, "K": 128}
    src = open(AG).read()
    assert auto.candidates(AG, src, 2, dims, dims)[0]["schedule"] == "fused-push"
    FAST_CE.save(tmp_path / "m.json")  # a calibrated machine whose copies cost nothing: dma wins
    monkeypatch.setenv("TILEC_MACHINE", str(tmp_path / "m.json"))
    assert auto.candidates(AG, src, 2, dims, dims)[0]["schedule"].endswith("+dma")
    entry = json.loads((tmp_path / "auto.json").read_text())[auto.key(src, 2, dims)]
    assert auto.PREDICTED in entry and any(f.startswith(auto.PREDICTED + "@") for f in entry)  # kept apart


def test_taxes_transport_auto_lists_both_transports(capsys):
    assert main(["taxes", AG, "-w", "2", "--transport", "auto"]) == 0
    out = capsys.readouterr().out
    assert "fused-push+dma " in out and "\nfused-push " in out and "copy engines:" in out
