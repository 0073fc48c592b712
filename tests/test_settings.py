"""Compile options and TILEC_* environment variables (tilec/settings.py): what changes a compiled program or its
launch is a tilec.compile option (a CLI flag), never an environment variable; a program records the values it was
compiled with in its module's header (so in its cache key) and in `tilec show`'s output; a bad value is named."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import tilec
from tilec import settings
from tilec.cli.commands import main
from tilec.errors import ArgumentError
from tilec.runtime.launch import LaunchContext

AG = "examples/ag_gemm.tile"
DIMS = dict(M=128, N=64, K=64, BM=64, BN=64, BK=32)
# each compile option, a value other than its default, and that value as an environment variable would spell it
OTHER = {"fold": (False, "0"), "pdl": (False, "off"), "wait_sleep_ns": (200, "200"), "programs_per_sm": (1, "1"),
         "dma_streams": (2, "2"), "wait_timeout": (7.5, "7.5"), "claim": ("on", "1")}


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.setattr(settings, "_WARNED", set())  # each bad value is named once a process: once a test here
    for name in settings.SETTINGS:
        if name != "TILEC_CACHE":
            monkeypatch.delenv(name, raising=False)


def _compile(**options):
    return tilec.compile(AG, world=2, schedule="fused-push", dims=DIMS, **options)


def test_every_variable_has_one_entry_and_the_compile_options_are_these():
    assert set(settings.OPTIONS) == set(OTHER)
    assert all(name.startswith("TILEC_") for name in settings.SETTINGS)
    assert settings.options() == settings.Options()  # the table's defaults are the Options' defaults
    assert all(getattr(settings.Options(), o.name) == o.default for o in settings.OPTIONS.values())


def test_an_option_changes_the_cache_key_and_the_header():
    base = _compile()
    assert base.options == settings.Options()
    keys = {base.cache_key}
    for opt, (v, _env) in OTHER.items():
        prog = _compile(**{opt: v})
        assert getattr(prog.options, opt) == v
        line = next(ln for ln in prog.source.splitlines() if ln.startswith("# settings: "))
        assert line == f"# {prog.options.line()}"
        word = v if isinstance(v, str) else ("on" if v else "off") if isinstance(v, bool) else f"{v:g}"
        assert f" {opt}={word}" in line
        keys.add(prog.cache_key)
    assert len(keys) == 1 + len(OTHER)  # every option is part of the key
    assert _compile().cache_key == base.cache_key  # and nothing else (the same options: the same key)


def test_what_the_options_do():
    assert "fold-last" in _compile().snapshots and "fold-last" not in _compile(fold=False).snapshots
    assert "with_wait_sleep" not in _compile().source
    assert "td = td.with_wait_sleep(200)" in _compile(wait_sleep_ns=200).source
    assert _compile(wait_timeout=7.5).wait_timeout == 7.5
    # the launch path takes the program's pdl / programs per SM / DMA streams, whatever the environment says
    props = SimpleNamespace(multi_processor_count=132, major=9)
    heap = SimpleNamespace(rank=0, interpret=False, device=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "get_device_properties", lambda dev: props)
        mp.setattr(torch.version, "hip", None)
        assert LaunchContext(heap, 10).pdl and LaunchContext(heap, 10).programs_per_sm == 2
        ctx = LaunchContext(heap, 10, pdl=False, programs_per_sm=1, dma_streams=3)
        assert (ctx.pdl, ctx.programs_per_sm, ctx.dma_streams) == (False, 1, 3)
        mp.setenv("TILEC_PDL", "0")  # not a setting: the option's default stays
        assert LaunchContext(heap, 10).pdl and not LaunchContext(heap, 10, pdl=False).pdl


def test_the_environment_sets_no_compile_option(monkeypatch, capsys):
    """A program is what its call says: variables named like the options change nothing (only the argument does),
    and each is named once on stderr so that a run meant with it does not pass silently without it."""
    plain = _compile()
    for opt, (_v, env) in OTHER.items():
        monkeypatch.setenv(f"TILEC_{opt.upper()}", env)
    prog = _compile()
    assert prog.options == settings.Options() and prog.cache_key == plain.cache_key
    err = capsys.readouterr().err
    for opt in OTHER:
        assert err.count(f"tilec: TILEC_{opt.upper()} is not read: compile options are arguments ({opt}=") == 1, err
    _compile()
    assert capsys.readouterr().err == ""  # once a process
    assert all(getattr(_compile(**{opt: v}).options, opt) == v for opt, (v, _env) in OTHER.items())
    from tilec.perf.auto import key

    src = Path(AG).read_text()
    assert key(src, 2, DIMS) == key(src, 2, DIMS, options=settings.Options())  # measured times: the defaults' key


def test_a_bad_value_is_named_and_the_default_used(monkeypatch, capsys):
    for name, raw in (("TILEC_BENCH_MAX_SPLITS", "-1"), ("TILEC_STOP_GRACE", "nan"), ("TILEC_CPU_ADVERSARY", "x"),
                      ("TILEC_MACHINE", " ")):
        monkeypatch.setenv(name, raw)
        assert settings.value(name) == settings.SETTINGS[name].default
        err = capsys.readouterr().err
        assert f"tilec: ignoring {name}={raw!r}: expected " in err or not raw.strip(), err


@pytest.mark.parametrize(("opt", "bad"), [("fold", "yes"), ("fold", 1), ("pdl", "off"), ("wait_sleep_ns", -1),
                                          ("wait_sleep_ns", 2.5), ("programs_per_sm", 0), ("dma_streams", 65),
                                          ("wait_timeout", 0), ("wait_timeout", "5"), ("programs_per_sm", True)])
def test_a_bad_option_is_named(opt, bad):
    with pytest.raises(ArgumentError, match=rf"^{opt}="):
        _compile(**{opt: bad})


def test_the_cli_flags_and_show_header(capsys, tmp_path):
    out = tmp_path / "k.py"
    argv = [AG, "-w", "2", "-s", "fused-push", *(x for d, v in DIMS.items() for x in ("-D", f"{d}={v}"))]
    assert main(["compile", *argv, "--fold", "off", "--programs-per-sm", "1", "--wait-timeout", "3", "-o",
                 str(out)]) == 0
    want = "# settings: fold=off pdl=on wait_sleep_ns=0 programs_per_sm=1 dma_streams=4 wait_timeout=3 claim=auto\n"
    assert want in out.read_text()
    capsys.readouterr()
    assert main(["show", *argv, "--pdl", "off", "--dma-streams", "2"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first == ("# settings: fold=on pdl=off wait_sleep_ns=0 programs_per_sm=2 dma_streams=2 wait_timeout=60"
                     " claim=auto")
    assert main(["compile", *argv, "--programs-per-sm", "0"]) == 2
    assert "--programs-per-sm 0: expected an integer from 1 to 64" in capsys.readouterr().err
    for cmd in ("bench", "tune"):  # refused before any rank starts, in the flag's words
        assert main([cmd, AG, "--backend", "cpu", "--wait-timeout", "-1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("--wait-timeout -1: expected a number above 0") and "rank" not in err, err


def test_the_options_reach_the_ptx():
    """Compiled for sm_90 (no GPU): wait_sleep_ns=N sleeps N ns between polls; pdl=False leaves out the
    programmatic-dependent-launch instructions that fused-push's one kernel otherwise starts with."""
    from tilec.codegen.target_check import compile_for_target

    (built,) = compile_for_target(_compile(wait_sleep_ns=250, pdl=False), "cuda:90")
    assert set(re.findall(r"nanosleep\.u32 (\d+);", built.ptx)) == {"250"}
    assert "griddepcontrol" not in built.ptx


def test_the_readme_lists_every_variable_and_option_with_its_default():
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    rows = dict(re.findall(r"^\| `(TILEC_\w+)` \| (`[^`]*`|—) \|", readme, re.M))
    assert set(rows) == set(settings.SETTINGS)
    for name, s in settings.SETTINGS.items():
        shown = {None: "—"}.get(s.default, f"`{s.default:g}`" if isinstance(s.default, int | float)
                                else f"`{s.default}`")
        assert shown == rows[name] or name == "TILEC_CACHE", (name, rows[name])
    # | `fold` | `--fold on\|off` | `True` | ...
    option_row = r"^\| `(\w+)` \| `(--[\w-]+)[^|]*(?:\\\|[^|]*)?` \| `([^`]*)` \|"
    opts = {m[0]: m[1:] for m in re.findall(option_row, readme, re.M)}
    assert set(opts) == set(settings.OPTIONS)
    for name, o in settings.OPTIONS.items():
        flag, default = opts[name]
        assert flag == "--" + name.replace("_", "-"), name
        assert default == (f"{o.default:g}" if isinstance(o.default, float) else str(o.default)), name
