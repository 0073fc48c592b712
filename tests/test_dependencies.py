"""Dependencies a user can defend: tilec's own metadata asks for no test tool at run time; the packages that Iris's
requirements drag in are never imported, neither by `import iris` nor by tilec; compiling imports no Iris or
Triton; the set-up takes torch's CPU build from PyTorch's CPU index."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib

import pytest

from tests._util import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# what tokenspeed-iris and tokenspeed-tritonblas require beyond what `import iris` uses (module names)
DRAGGED_IN = ("pandas", "matplotlib", "hatchet", "textx", "yaml", "requests", "multiprocess", "pytest", "ruff")


def _name(req: str) -> str:
    return re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower().replace("_", "-")


def _modules_after(code: str) -> set[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", code + "\nimport sys; print(' '.join(sorted(sys.modules)))"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return {m.split(".")[0] for m in p.stdout.split()}


def test_no_test_tools_at_run_time():
    run_time = {_name(r) for r in PROJECT["dependencies"]}
    assert not run_time & {"pytest", "ruff", "black", "mypy"}, run_time
    assert {_name(r) for r in PROJECT["optional-dependencies"]["dev"]} >= {"pytest", "ruff"}


@pytest.mark.skipif(importlib.util.find_spec("iris") is None, reason="Iris is not installed")
def test_import_iris_needs_none_of_what_its_requirements_add():
    assert not _modules_after("import iris") & set(DRAGGED_IN)


def test_compiling_imports_no_iris_nor_triton(tmp_path):
    out = tmp_path / "ag.py"
    mods = _modules_after(f"from tilec.cli import main; assert main(['compile', 'examples/ag_gemm.tile', '-s', 'bsp',"
                          f" '-o', {str(out)!r}]) == 0")
    assert out.exists()
    assert not mods & {"iris", "tritonblas", "triton", *DRAGGED_IN}, sorted(mods & {"iris", "triton"})


def test_setup_takes_torch_from_the_cpu_index():
    index = "https://download.pytorch.org/whl/cpu"
    setup = (ROOT / "README.md").read_text().split("## Set-up", 1)[1].split("```")[1]
    first = setup.strip().splitlines()[0]
    assert f"pip install torch --index-url {index} && pip install -e " in first
    ci = (ROOT / ".ci" / "run").read_text()
    torch_line = next(ln for ln in ci.splitlines() if ln.startswith("pip install") and "torch" in ln)
    assert index in torch_line and "+cpu" in torch_line  # only a CPU build can match, from either source
