"""Probe: does the KV layout or the split stage's task order limit the persistent flash-decode kernel's bandwidth?

Variants of examples/flash_decode.tile (text edits of the example, nothing else changes):
- `hsd` (as written): K, V [B, HKV, S, D], head-major: each split task reads one contiguous run of keys;
- `bshd`: K, V [B, S, HKV, D], position-major (FlashAttention's KV cache): a task reads 256-byte rows one
  KV-head apart, and programs running together read the same head in different blocks of positions;
- `-jg`: the split stage iterates (b, j, g) instead of (b, g, j): programs running together work on all heads of
  the same positions.
Times whole calls (tilec.perf.bench.time_checked: CUDA events, median of 20), fused-push, world 1, bf16, B1 H128
(HKV 16, GQA 8), D 128.
Run on the device: python benchmarks/decode_layout_probe.py > probe.log
(Recorded in benchmarks/results/h200-1gpu/decode_layout_probe.log, when the example was still position-major:
there `as-written` is today's `bshd` and `hsd` today's example.)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

import tilec
from tilec.perf.bench import time_checked
from tilec.perf.bench_decode import kv_bytes, make_inputs
from tilec.runtime import spawn

EX = Path("examples/flash_decode.tile")
SPLIT_BGJ = "stage split over b in B by 1, g in HKV by 1, j in S/BS by 1,"
SPLIT_BJG = "stage split over b in B by 1, j in S/BS by 1, g in HKV by 1,"
HEAD_MAJOR_TO_POSITION_MAJOR = (("f16[B, HKV, S, D]", "f16[B, S, HKV, D]"),
                                ("K[b, g, j*BS + p, :]", "K[b, j*BS + p, g, :]"),
                                ("V[b, g, j*BS + p, :]", "V[b, j*BS + p, g, :]"))
VARIANTS = ("hsd", "hsd-jg", "bshd", "bshd-jg")


def variant(name: str) -> str:
    text = EX.read_text()
    assert SPLIT_BGJ in text
    if name.endswith("-jg"):
        text = text.replace(SPLIT_BGJ, SPLIT_BJG)
    if name.startswith("bshd"):
        for head_major, position_major in HEAD_MAJOR_TO_POSITION_MAJOR:
            assert head_major in text
            text = text.replace(head_major, position_major)
    return text


def probe(heap):
    tmp = Path(tempfile.mkdtemp())
    for s, bs in ((32768, 1024), (131072, 4096), (1048576, 32768)):
        dims = dict(B=1, HKV=16, G=8, D=128, S=s)
        q, k, v, lens = make_inputs(dims, 1, 0, "bf16", heap.device)  # position-major
        kh, vh = k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()
        o = torch.empty(q.shape, dtype=q.dtype, device=heap.device)
        ref = None
        for name in VARIANTS:
            path = tmp / f"fd_{name.replace('-', '_')}.tile"
            path.write_text(variant(name))
            try:
                prog = tilec.compile(str(path), world=1, schedule="fused-push", dims={**dims, "BS": bs},
                                     retype={"f16": "bf16"}, num_warps=4, num_stages=3)
                args = dict(Q=q, K=kh, V=vh) if name.startswith("hsd") else dict(Q=q, K=k, V=v)
                us = time_checked(prog, heap, dict(args, lens=lens, O=o), 20, 3) * 1e6
                print(f"S={s} BS={bs} {name}: {us:.1f} us {kv_bytes(dims, 'bf16') / us / 1e3:.0f} GB/s"
                      f" programs/SM={prog.programs_per_sm(heap)}", flush=True)
                if ref is None:
                    ref = o.clone()
                else:
                    print(f"    max |O - O({VARIANTS[0]})| = {(o.float() - ref.float()).abs().max().item():.2e}")
            except Exception as e:  # noqa: BLE001 - a probe: report and go on
                print(f"S={s} {name}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        del k, v, kh, vh
        torch.cuda.empty_cache()


if __name__ == "__main__":
    spawn("benchmarks.decode_layout_probe:probe", 1, backend="iris", heap_bytes=1 << 28, timeout=600)
    sys.exit(0)
