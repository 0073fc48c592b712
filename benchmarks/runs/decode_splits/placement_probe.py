"""Does where K and V sit in memory change a decode step's time? The same compiled fused-push program and torch
SDPA, timed (CUDA graph replays after a reading L2 flush) on the bench's K/V (perf.inputs.make_inputs), on fresh
copies of them (torch.zeros + copy_) and on clones, then on the first pair again. Prints each pair's addresses.
Usage: python benchmarks/runs/decode_splits/placement_probe.py"""
import torch
import torch.nn.functional as F

import tilec
from tilec.perf.inputs import make_inputs
from tilec.perf.measure import time_op, time_program
from tilec.runtime import spawn

SHAPES = {(8, 16, 8, 128, 16384): 8192, (1, 12, 8, 128, 65536): 4096, (1, 16, 8, 128, 8192): 512}


def run(heap):
    out = []
    for (b, hkv, g, d, s), bs in SHAPES.items():
        dims = {"B": b, "HKV": hkv, "G": g, "D": d, "S": s}
        q, k0, v0, lens = make_inputs(dims, 1, 0, "bf16", heap.device, layout="bhsd")
        k1, v1 = torch.zeros_like(k0), torch.zeros_like(v0)
        k1.copy_(k0)
        v1.copy_(v0)
        k2, v2 = k0.clone(), v0.clone()
        prog = tilec.compile("examples/flash_decode.tile", world=1, schedule="fused-push", retype={"f16": "bf16"},
                             dims={**dims, "BS": bs}, num_warps=4, num_stages=3)
        out.append(f"B{b} H{hkv * g} S{s // 1024}K BS {bs} ({k0.numel() * 2 / 2**20:.0f} MiB each of K, V)")
        for name, (k, v) in (("make_inputs", (k0, v0)), ("zeros+copy", (k1, v1)), ("clone", (k2, v2)),
                             ("make_inputs again", (k0, v0))):
            sd = time_op(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True),
                         heap, 20, 3)
            args = {"Q": q, "K": k, "V": v, "lens": lens, "O": torch.empty_like(q)}
            t = time_program(prog, heap, args, 20, 2, host_iters=1)
            gap = v.data_ptr() - k.data_ptr()
            out.append(f"  {name:18s} K at {k.data_ptr():#x} V-K {gap / 2**20:+.0f} MiB (mod 1 GiB {gap % 2**30:#x}):"
                       f" tilec {t.device_us:6.1f} us (p10 {t.p10_us:.1f} p90 {t.p90_us:.1f}), sdpa {sd.device_us:6.1f}"
                       f" (p10 {sd.p10_us:.1f} p90 {sd.p90_us:.1f}): {sd.device_us / t.device_us:.3f}x")
            print(out[-1], flush=True)
        del q, k0, v0, k1, v1, k2, v2
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    print("\n".join(spawn(run, 1, backend="iris", heap_bytes=1 << 30, timeout=560)[0]), flush=True)
