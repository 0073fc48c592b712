"""tilec: compile bulk-synchronous tile dataflow programs (.tile) into fine-grained Iris/Triton kernels."""

__version__ = "0.1.0"

from tilec import runtime  # noqa: E402
from tilec.api import CompiledProgram, compile  # noqa: E402

__all__ = ["compile", "CompiledProgram", "runtime", "__version__"]
