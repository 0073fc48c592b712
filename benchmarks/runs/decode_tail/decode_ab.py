"""World-1 A/B of flash decode's persistent kernel under the compile options given (--fold, --wait-sleep-ns, ...:
the flags of the tilec commands): fused-push at its default launch config against torch SDPA (enable_gqa), both CUDA
graph replays after a reading L2 flush (perf.measure). One line per shape.
Usage: python benchmarks/runs/decode_tail/decode_ab.py [LABEL] [--fold on|off] [--wait-sleep-ns NS] ..."""
import argparse

import torch
import torch.nn.functional as F

import tilec
from tilec.cli.args import _option_flags, _option_values
from tilec.perf.bench_decode import default_bs
from tilec.perf.inputs import make_inputs
from tilec.perf.measure import time_op, time_program
from tilec.runtime import spawn

SHAPES = [(1, 16, 8, 128, 8192), (1, 12, 8, 128, 65536), (8, 16, 8, 128, 16384)]  # (B, HKV, G, D, S)


def run(heap, label, options):
    out = []
    for b, hkv, g, d, s in SHAPES:
        dims = {"B": b, "HKV": hkv, "G": g, "D": d, "S": s}
        q, k, v, lens = make_inputs(dims, 1, 0, "bf16", heap.device, layout="bhsd")
        sd = time_op(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True),
                     heap, 20, 3)
        ref = F.scaled_dot_product_attention(q.unsqueeze(2).float(), k.float(), v.float(), enable_gqa=True)
        prog = tilec.compile("examples/flash_decode.tile", world=1, schedule="fused-push", retype={"f16": "bf16"},
                             dims={**dims, "BS": default_bs(dims, False)}, **options)
        args = {"Q": q, "K": k, "V": v, "lens": lens, "O": torch.empty_like(q)}
        t = time_program(prog, heap, args, 20, 2, host_iters=1)
        err = ((args["O"].float() - ref.squeeze(2)).abs().max() / ref.abs().max()).item()
        out.append(f"{label:28s} B{b} H{hkv * g} S{s // 1024}K: fused-push {t.device_us:7.1f} us, sdpa "
                   f"{sd.device_us:7.1f} us, {sd.device_us / t.device_us:.3f}x sdpa, err {err:.1e}")
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("label", nargs="?")
    _option_flags(ap)  # --fold, --wait-sleep-ns, ...: the compile options' flags of the tilec commands
    a = ap.parse_args()
    options = _option_values(a)  # those given; the others keep tilec.compile's defaults
    label = a.label or " ".join(f"{k}={v}" for k, v in options.items())
    print("\n".join(spawn(run, 1, backend="iris", heap_bytes=1 << 30, timeout=500, args=(label, options))[0]),
          flush=True)
