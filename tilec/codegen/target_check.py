"""Compile a program's kernels for a GPU target without a GPU (`tilec check --target cuda:90`).

Triton's wheel carries ptxas, so the whole path from the generated Python to a cubin runs on any machine. The CPU
emulation runs kernels through the interpreter, which accepts things the GPU compiler rejects (plain Python calls,
shapes tl.dot refuses, ...): this catches those before a GPU is at hand.
"""

from __future__ import annotations

from tilec.errors import TilecError

_PTR = {"f16": "*fp16", "bf16": "*bf16", "f32": "*fp32", "i32": "*i32"}
_SCALARS = {"rank": "i32", "epoch": "i32", "max_spin": "i32"}


def parse_target(text: str):
    """'cuda:90' -> GPUTarget('cuda', 90, 32); 'hip:gfx942' -> GPUTarget('hip', 'gfx942', 64)."""
    from triton.backends.compiler import GPUTarget

    backend, _, arch = text.partition(":")
    if backend == "cuda" and arch.isdigit():
        return GPUTarget("cuda", int(arch), 32)
    if backend == "hip" and arch.startswith("gfx"):
        return GPUTarget("hip", arch, 64)
    raise TilecError(f"--target {text!r}: expected cuda:<sm>, e.g. cuda:90, or hip:<gfx>, e.g. hip:gfx942")


def compile_for_target(prog, target: str = "cuda:90", nprog: int = 132) -> list[tuple[str, int]]:
    """Compiles every kernel of `prog` (a CompiledProgram) for `target`; returns (kernel, shared memory bytes).
    Raises TilecError naming the kernel when Triton rejects one."""
    import triton
    from triton.compiler import ASTSource

    tgt = parse_target(target)
    mod = prog.module
    out = []
    for k, *_rest in mod.KERNELS:
        sig: dict[str, str] = {}
        for name in k.arg_names:
            if name in mod.TENSORS:
                sig[name] = _PTR[mod.TENSORS[name][1]]
            elif name in mod.FLAGS or name == "ERR":
                sig[name] = "*i32"
            elif name in ("heap_bases", "TIMELINE"):
                sig[name] = "*i64"
            elif name in _SCALARS:
                sig[name] = _SCALARS[name]
            else:
                sig[name] = "constexpr"
        src = ASTSource(k, sig, constexprs={"NPROG": nprog, "UPCAST_DOT": False})
        try:
            ck = triton.compile(src, target=tgt, options={"num_warps": mod.NUM_WARPS, "num_stages": mod.NUM_STAGES})
        except Exception as e:  # Triton's compile errors carry the offending source line
            lines = str(e).strip().splitlines()
            raise TilecError(f"{prog.program.name} ({prog.schedule}): kernel {k.__name__} does not compile for "
                             f"{target}: {type(e).__name__}: {' | '.join(lines[-6:])}") from e
        out.append((k.__name__, int(ck.metadata.shared)))
    return out
