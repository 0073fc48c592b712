"""The element types of the language, as each layer names them (one table: add a dtype here)."""

from __future__ import annotations

DTYPES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "i32": "int32"}  # .tile name -> torch/numpy name
ESIZE = {"f16": 2, "bf16": 2, "f32": 4, "i32": 4}  # bytes per element
TL_DTYPE = {d: f"tl.{n}" for d, n in DTYPES.items()}  # Triton's name in emitted source
PTR_SIG = {"f16": "*fp16", "bf16": "*bf16", "f32": "*fp32", "i32": "*i32"}  # a pointer in a Triton signature


def torch_dtype(d: str):
    import torch

    return getattr(torch, DTYPES[d])
