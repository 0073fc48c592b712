"""Files and caches: outputs go only to regular files or new paths (special files are refused and left as they
were), through a temporary file and os.replace (nothing half-written, no temporary left); the JSON caches under
cache_dir() lose no record under concurrent writers; CPU-emulation timings never land where a GPU's choice reads."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import stat

import pytest

import tilec
from tests._util import EXAMPLE, ROOT
from tilec.cli import main
from tilec.fileio import OutputPathError, output_path, write_atomic
from tilec.perf import auto, measure


@pytest.fixture
def cache(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("TILEC_CACHE", str(d))
    return d


def _special(tmp_path, kind: str):
    """A path of `kind` that is not a regular file (made here, never a system device) and the test it passes."""
    if kind in ("fifo", "link"):
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        if kind == "fifo":
            return fifo, stat.S_ISFIFO
        link = tmp_path / "link"
        link.symlink_to(fifo)
        return link, stat.S_ISFIFO
    if kind == "socket":
        sock = tmp_path / "sock"
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(sock))
        s.close()
        return sock, stat.S_ISSOCK
    folder = tmp_path / "folder"
    folder.mkdir()
    return folder, stat.S_ISDIR


def _listing(d):
    return sorted(p.name for p in d.iterdir())


@pytest.mark.parametrize("kind", ["fifo", "socket", "directory", "link"])
def test_special_files_are_refused_by_every_writer(tmp_path, kind, capsys, monkeypatch):
    path, what = _special(tmp_path, kind)
    before = _listing(tmp_path)
    with pytest.raises(OutputPathError, match=str(path)):
        output_path(path)
    with pytest.raises(OutputPathError):
        write_atomic(path, "x")
    prog = tilec.compile(str(EXAMPLE), world=1, schedule="bsp", dims={"M": 64, "N": 64, "K": 32})
    with pytest.raises(OutputPathError):
        prog.save(path)
    monkeypatch.chdir(ROOT)
    for argv in (["compile", "examples/ag_gemm.tile", "-s", "bsp", "-o", str(path)],
                 ["taxes", "examples/ag_gemm.tile", "--plot", str(path)],
                 ["calibrate", "-o", str(path)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert str(path) in err and len(err.strip().splitlines()) == 1, err
    assert what(os.stat(path).st_mode)  # still what it was (followed through the link)
    assert _listing(tmp_path) == before  # and nothing was left beside it


def test_outputs_replace_regular_files_whole(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "k.py"
    out.write_text("old")
    os.chmod(out, 0o640)
    assert main(["compile", "examples/ag_gemm.tile", "-s", "bsp", "-D", "M=64", "-o", str(out)]) == 0
    src = out.read_text()
    assert "def launch" in src or "@triton.jit" in src
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o640 and _listing(tmp_path) == ["k.py"]
    new = tmp_path / "sub"
    with pytest.raises(OutputPathError, match="does not exist"):
        write_atomic(new / "x.txt", "x")
    # a writer that fails half-way leaves the old file and no temporary behind

    def half(p):
        p.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        write_atomic(out, half)
    assert out.read_text() == src and _listing(tmp_path) == ["k.py"]
    # bench --out naming a file is refused before any timing
    assert main(["bench", "examples/ag_gemm.tile", "--out", str(out), "--backend", "cpu"]) == 2
    assert str(out) in capsys.readouterr().err


def _record_many(worker: int, n: int) -> None:
    for i in range(n):
        auto.record_measured(f"key{worker}", f"sched{i}", float(i))
        measure.store_tuned({f"w{worker}|{i}": [worker, i]})


def test_concurrent_cache_writers_lose_nothing(cache):
    workers, each = 8, 25
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_record_many, args=(w, each)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    data = auto._load()
    assert sum(len(v["measured"]) for v in data.values()) == workers * each
    assert all(data[f"key{w}"]["measured"] == {f"sched{i}": float(i) for i in range(each)} for w in range(workers))
    assert len(measure.load_tuned()) == workers * each
    assert not [p for p in cache.iterdir() if p.suffix not in (".json", ".lock")]  # no temporaries left


def test_cpu_timings_never_reach_a_gpu_choice(cache):
    """Trials on the CPU emulation in a process that sees a GPU ("FakeGPU"): the times go under the CPU key; a
    choice made for that GPU reads none of them, a CPU one reads them all."""
    from tilec.runtime import spawn

    path = str(ROOT / "tests" / "programs" / "elementwise.tile")
    dims = {"M": 16, "N": 8}
    (trials,) = spawn("tests.test_files_caches:_trials_as_if_on_a_gpu", 1, args=(path, dims), heap_bytes=1 << 22,
                      timeout=600)
    assert trials and all(t.measured_us is not None for t in trials)
    data = auto._load()
    assert data and all(k.endswith(f"|{auto.CPU_KEY}") for k in data), list(data)
    base = tilec.compile(path, 1, "bsp", dims)
    src, bound = base.program.source, dict(base.program.dims)
    cpu_rows = auto.candidates(base, src, 1, dims, bound)
    assert {r["schedule"] for r in cpu_rows} == {t.schedule for t in trials}
    assert all(r["measured_us"] is not None for r in cpu_rows)
    orig = auto.this_device
    auto.this_device = lambda: "FakeGPU"
    try:
        gpu_rows = auto.candidates(base, src, 1, dims, bound)
    finally:
        auto.this_device = orig
    assert gpu_rows and all(r["measured_us"] is None for r in gpu_rows)


def test_auto_predictions_follow_the_tiles_and_granularity_asked_for(cache):
    """One shape asked for with other tile sizes or another flag granularity is ranked again, not read from the
    first request's cached predictions (the key is the shape's, so measured times are shared)."""
    path = str(ROOT / "examples" / "ag_gemm.tile")
    shape = {"M": 512, "N": 256, "K": 256}
    base = tilec.compile(path, 2, "bsp", shape)
    src, bound = base.program.source, dict(base.program.dims)

    def predicted(dims, granularity="auto"):
        return {r["schedule"]: r["predicted_us"] for r in auto.candidates(base, src, 2, dims, bound, granularity)}

    small = predicted({**shape, "BM": 32, "BN": 32})
    big = predicted({**shape, "BM": 128, "BN": 128})
    assert small != big  # the model sees other task counts, not the first request's numbers
    assert predicted({**shape, "BM": 32, "BN": 32}) == small  # and each request's ranking is cached
    assert predicted(shape, "tensor") != predicted(shape)
    assert len(auto._load()) == 1  # one key for the shape: measured times are shared by all of them


def _trials_as_if_on_a_gpu(heap, path, dims):
    from tilec.perf.trials import trial_rank

    auto.this_device = lambda: "FakeGPU"  # what a process on a GPU machine would report
    measure.gpu_name = lambda: "FakeGPU"
    return trial_rank(heap, path, dims, iters=1, warmup=0)


def test_bench_tuning_keys_name_the_device():
    class Heap:
        interpret = True

    assert measure.device_key(Heap()) == auto.CPU_KEY
