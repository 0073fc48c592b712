"""World-1 A/B of flash decode's persistent kernel under the current environment (TILEC_FOLD, TILEC_WAIT_SLEEP_NS,
...): fused-push at its default launch config against torch SDPA (enable_gqa), both CUDA graph replays after a
reading L2 flush (perf.measure). One line per shape. Usage: python benchmarks/runs/decode_tail/decode_ab.py LABEL"""
import os
import sys

import torch
import torch.nn.functional as F

import tilec
from tilec.perf.bench_decode import default_bs
from tilec.perf.inputs import make_inputs
from tilec.perf.measure import time_op, time_program
from tilec.runtime import spawn

SHAPES = [(1, 16, 8, 128, 8192), (1, 12, 8, 128, 65536), (8, 16, 8, 128, 16384)]  # (B, HKV, G, D, S)


def run(heap, label):
    out = []
    for b, hkv, g, d, s in SHAPES:
        dims = {"B": b, "HKV": hkv, "G": g, "D": d, "S": s}
        q, k, v, lens = make_inputs(dims, 1, 0, "bf16", heap.device, layout="bhsd")
        sd = time_op(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True),
                     heap, 20, 3)
        ref = F.scaled_dot_product_attention(q.unsqueeze(2).float(), k.float(), v.float(), enable_gqa=True)
        prog = tilec.compile("examples/flash_decode.tile", world=1, schedule="fused-push", retype={"f16": "bf16"},
                             dims={**dims, "BS": default_bs(dims, False)})
        args = {"Q": q, "K": k, "V": v, "lens": lens, "O": torch.empty_like(q)}
        t = time_program(prog, heap, args, 20, 2, host_iters=1)
        err = ((args["O"].float() - ref.squeeze(2)).abs().max() / ref.abs().max()).item()
        out.append(f"{label:28s} B{b} H{hkv * g} S{s // 1024}K: fused-push {t.device_us:7.1f} us, sdpa "
                   f"{sd.device_us:7.1f} us, {sd.device_us / t.device_us:.3f}x sdpa, err {err:.1e}")
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    label = sys.argv[1] if len(sys.argv) > 1 else " ".join(f"{k}={v}" for k, v in os.environ.items()
                                                           if k.startswith("TILEC_"))
    print("\n".join(spawn(run, 1, backend="iris", heap_bytes=1 << 30, timeout=500, args=(label,))[0]), flush=True)
