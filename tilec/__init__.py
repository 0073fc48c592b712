"""tilec: compile bulk-synchronous tile dataflow programs (.tile) into fine-grained Iris/Triton kernels."""

from tilec import runtime
from tilec._version import __version__
from tilec.api import CompiledProgram, compile
from tilec.ops import TileOp, empty, op

__all__ = ["compile", "CompiledProgram", "runtime", "op", "empty", "TileOp", "__version__"]
