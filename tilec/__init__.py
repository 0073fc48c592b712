"""tilec: compile bulk-synchronous tile dataflow programs (.tile) into fine-grained Iris/Triton kernels."""

from tilec._version import __version__

__all__ = ["compile", "CompiledProgram", "runtime", "op", "empty", "TileOp", "__version__"]

# The public names load on first use, with torch (and on a run triton and iris): `tilec --help`, `--version` and the
# front end import none of them.
_LAZY = {"compile": "tilec.api", "CompiledProgram": "tilec.api", "op": "tilec.ops", "empty": "tilec.ops",
         "TileOp": "tilec.ops", "runtime": None}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'tilec' has no attribute '{name}'")
    import importlib

    module = importlib.import_module(_LAZY[name] or f"tilec.{name}")
    value = module if _LAZY[name] is None else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
