"""The package's layers point one way: no module imports from a layer above its own, and no import cycle.

Every import counts, also those inside functions (a lazy import is still a dependency); `if TYPE_CHECKING:` blocks
do not (they never run).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx

TILEC = Path(__file__).resolve().parents[1] / "tilec"

# bottom to top; a module may import from its own layer and the ones below it
LAYERS = [
    ("tilec.errors", "tilec._version", "tilec.fileio", "tilec.settings"),
    ("tilec.ir",),
    ("tilec.frontend",),
    ("tilec.passes",),
    ("tilec.codegen", "tilec.device"),
    ("tilec.runtime",),
    ("tilec.program", "tilec.reference", "tilec.api", "tilec.run_vs_reference", "tilec.ops", "tilec"),
    ("tilec.perf",),
    ("tilec.cli", "tilec.__main__"),
]


def module_name(path: Path) -> str:
    parts = path.relative_to(TILEC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    best = None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > best[1]):
                best = (i, len(p))
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best[0]


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(path: Path, modules: set[str], me: str | None = None) -> set[str]:
    """The tilec modules `path` (module `me`) imports (`from pkg import name` counts as pkg.name when that is a
    module)."""
    me = me or module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for c in child.orelse:
                    visit(c)
                continue
            if isinstance(child, ast.Import):
                out.update(a.name for a in child.names if a.name.split(".")[0] == "tilec")
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                if base.split(".")[0] != "tilec":
                    continue
                for a in child.names:
                    out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
            visit(child)

    visit(ast.parse(path.read_text()))
    out.discard(me)
    return out


def import_graph() -> nx.DiGraph:
    files = sorted(TILEC.rglob("*.py"))
    modules = {module_name(f) for f in files}
    g = nx.DiGraph()
    for f in files:
        g.add_node(module_name(f))
        for target in imports(f, modules):
            g.add_edge(module_name(f), target)
    return g


def test_every_module_has_a_layer():
    for m in import_graph():
        layer(m)


def test_no_import_points_upward():
    up = [f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
          for a, b in import_graph().edges if layer(b) > layer(a)]
    assert not up, "upward imports:\n" + "\n".join(up)


def test_no_import_cycle():
    g = import_graph()
    # a package's __init__ re-exporting its own submodules is not a cycle between layers
    g.remove_edges_from([(a, b) for a, b in list(g.edges) if b.startswith(a + ".")])
    cycles = list(nx.simple_cycles(g))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join([*c, c[0]]) for c in cycles)


def test_the_compiler_does_not_load_the_perf_layer():
    code = ("import sys, tilec; p = tilec.compile('examples/ag_gemm.tile', world=2, schedule='fused-push'); "
            "assert p.source; print(sorted(m for m in sys.modules if m.startswith('tilec.perf') "
            "or m.startswith('tilec.cli')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=TILEC.parent, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_check_sees_lazy_and_relative_imports(tmp_path):
    """The walk itself: imports inside functions and relative ones are found; TYPE_CHECKING ones are not."""
    mods = {module_name(p) for p in TILEC.rglob("*.py")}
    fake = tmp_path / "fake.py"
    fake.write_text("from typing import TYPE_CHECKING\nfrom .graph import Flag\nif TYPE_CHECKING:\n"
                    "    from tilec.program import CompiledProgram\n"
                    "def f():\n    from tilec.perf import bench\n")
    got = imports(fake, mods, me="tilec.ir.fake")
    assert got == {"tilec.ir.graph", "tilec.perf.bench"}
    assert layer("tilec.perf.bench") > layer("tilec.ir.fake")
