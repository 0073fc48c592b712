"""Why the first tilec program timed after the f32 reference of a large decode shape runs slow (ragged_probe3.log:
B8 H128 S16K 288 us, the same program 253 us two configs later): SDPA and the fused-push program timed before and
after the reference computation, then after a pause, with the GPU's clocks and throttle reasons (nvidia-smi)
at each step. Usage: python benchmarks/runs/order_probe.py"""
import subprocess
import time

import torch
import torch.nn.functional as F

import tilec
from tilec.perf.inputs import make_inputs
from tilec.perf.measure import time_op, time_program
from tilec.runtime import spawn

Q = "clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def smi():
    try:
        return subprocess.run(["nvidia-smi", f"--query-gpu={Q}", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except Exception as e:  # noqa: BLE001
        return f"nvidia-smi: {e}"


def run(heap):
    out = []
    dims = {"B": 8, "HKV": 16, "G": 8, "D": 128, "S": 16384}
    q, k, v, lens = make_inputs(dims, 1, 0, "bf16", heap.device, layout="bhsd")
    prog = tilec.compile("examples/flash_decode.tile", world=1, schedule="fused-push", retype={"f16": "bf16"},
                         dims={**dims, "BS": 8192}, num_warps=4, num_stages=3)
    args = {"Q": q, "K": k, "V": v, "lens": lens, "O": torch.empty_like(q)}

    def sdpa():
        return F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True)

    def both(what):
        s0 = smi()
        sd = time_op(sdpa, heap, 20, 3)
        s1 = smi()
        t = time_program(prog, heap, args, 20, 2, host_iters=1)
        s2 = smi()
        out.append(f"{what:34s} sdpa {sd.device_us:6.1f} (p90 {sd.p90_us:.1f})  tilec {t.device_us:6.1f} "
                   f"(p90 {t.p90_us:.1f})\n    smi before: {s0}\n    after sdpa: {s1}\n    after tilec: {s2}")
        print(out[-1], flush=True)

    both("first")
    both("again")
    ref = F.scaled_dot_product_attention(q.unsqueeze(2).float(), k.float(), v.float(), enable_gqa=True)
    torch.cuda.synchronize()
    out.append(f"after the f32 reference: {smi()}")
    both("right after the f32 reference")
    both("again")
    del ref
    time.sleep(2)
    both("after a 2 s pause")
    return out


if __name__ == "__main__":
    print("\n".join(spawn(run, 1, backend="iris", heap_bytes=1 << 30, timeout=300)[0]), flush=True)
