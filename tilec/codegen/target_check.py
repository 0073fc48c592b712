"""Compile a program's kernels for a GPU target without a GPU (`tilec check --target cuda:90`).

Triton's wheel carries ptxas, so the whole path from the generated Python to a cubin runs on any machine. The CPU
emulation runs kernels through the interpreter, which accepts things the GPU compiler rejects (plain Python calls,
shapes tl.dot refuses, ...): this catches those before a GPU is at hand.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass, field

from tilec.errors import TilecError
from tilec.ir.dtypes import PTR_SIG

_SCALARS = {"rank": "i32", "epoch": "i32", "timeout_ns": "i64"}


def parse_target(text: str):
    """'cuda:90' -> GPUTarget('cuda', 90, 32); 'hip:gfx942' -> GPUTarget('hip', 'gfx942', 64)."""
    from triton.backends.compiler import GPUTarget

    backend, _, arch = text.partition(":")
    if backend == "cuda" and arch.isdigit():
        return GPUTarget("cuda", int(arch), 32)
    if backend == "hip" and arch.startswith("gfx"):
        return GPUTarget("hip", arch, 64)
    raise TilecError(f"--target {text!r}: expected cuda:<sm>, e.g. cuda:90, or hip:<gfx>, e.g. hip:gfx942")


@dataclass(frozen=True)
class Built:
    kernel: str
    shared: int  # bytes of shared memory per program
    registers: int | None  # per thread, from the cubin (None: no cuobjdump for this target)
    spilled: int | None  # bytes of stack and local memory per thread (register spills): > 0 is slow
    ptx: str = field(default="", repr=False, compare=False)  # the PTX (NVIDIA targets), for inspection

    def describe(self) -> str:
        regs = "" if self.registers is None else f", {self.registers} registers" + (
            f", SPILLS {self.spilled} B" if self.spilled else ", no spills")
        return f"{self.kernel} ({self.shared // 1024} KiB shared{regs})"


def _resources(cubin: bytes) -> tuple[int | None, int | None]:
    """Registers and spill bytes (stack frame + local memory) per thread, read with the cuobjdump that ships with
    Triton."""
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+).*LOCAL:(\d+)", out)
    return (int(m.group(1)), int(m.group(2)) + int(m.group(3))) if m else (None, None)


def compile_for_target(prog, target: str = "cuda:90", nprog: int = 132, rank: int | None = None) -> list[Built]:
    """Compiles every kernel of `prog` (a CompiledProgram) for `target`; returns what each needs per program.
    Raises TilecError naming the kernel when Triton rejects one. rank: compile as a launch on that rank would, where
    Triton makes an integer argument of 1 a constant unless the kernel's do_not_specialize names it."""
    import triton
    from triton.compiler import ASTSource

    tgt = parse_target(target)
    mod = prog.module
    # what the launch path turns on there (tilec.runtime.launch.serial: no concurrent kernel pair; the program's pdl)
    pdl = (tgt.backend == "cuda" and tgt.arch >= 90 and not any(k[3] for k in mod.KERNELS)
           and getattr(prog.options, "pdl", True))
    out = []
    for k, *_rest, buffers in mod.KERNELS:
        sig: dict[str, str] = {}
        for i, name in enumerate(k.arg_names):
            buf = buffers[i] if i < len(buffers) else name  # the buffers come first, by position
            if buf in mod.TENSORS:
                sig[name] = PTR_SIG[mod.TENSORS[buf][1]]
            elif buf in mod.FLAGS:  # backend nvshmem: 64-bit signal words
                sig[name] = "*i64" if getattr(mod, "BACKEND", "iris") == "nvshmem" else "*i32"
            elif buf in ("ERR", "EPOCH_AT"):
                sig[name] = "*i32"
            elif buf in ("heap_bases", "TIMELINE"):
                sig[name] = "*i64"
            elif buf in _SCALARS:
                sig[name] = _SCALARS[buf]
            else:
                sig[name] = "constexpr"
        # pointers as the runtime sees heap and torch tensors: 16-byte aligned (Triton pipelines loads only then)
        aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(k.arg_names) if sig[n].startswith("*")}
        constexprs = {"NPROG": nprog, "INTERPRET": False, "PDL": pdl}
        if rank == 1 and not any(p.name == "rank" and p.do_not_specialize for p in k.params):
            sig["rank"], constexprs["rank"] = "constexpr", 1
        src = ASTSource(k, sig, constexprs=constexprs, attrs=aligned)
        try:
            ck = triton.compile(src, target=tgt, options={"num_warps": mod.NUM_WARPS, "num_stages": mod.NUM_STAGES})
        except Exception as e:  # Triton's compile errors carry the offending source line
            lines = str(e).strip().splitlines()
            raise TilecError(f"{prog.program.name} ({prog.schedule}): kernel {k.__name__} does not compile for "
                             f"{target}: {type(e).__name__}: {' | '.join(lines[-6:])}") from e
        regs, local = _resources(ck.asm["cubin"]) if "cubin" in ck.asm else (None, None)
        out.append(Built(k.__name__, int(ck.metadata.shared), regs, local, ck.asm.get("ptx", "")))
    return out
