"""Do the streamed K/V loads of flash decode gain from cache hints? The free-split example (the bench's NS, L) with
its attend loads as emitted, with eviction_policy="evict_first" (streamed once: keep L2 for the partials), with
cache_modifier=".cg" (skip L1) and both; each a CUDA graph replay after a reading L2 flush beside torch SDPA
(enable_gqa) in the same run. The hints are patched into codegen here, not in tilec.
Usage: python benchmarks/runs/decode_splits/evict_probe.py"""
import torch
import torch.nn.functional as F

import tilec
import tilec.codegen.compute as compute
from tilec.perf.bench_decode import default_splits
from tilec.perf.inputs import make_inputs, with_room
from tilec.perf.measure import time_op, time_program
from tilec.runtime import spawn

SPLITS = "examples/flash_decode_splits.tile"
SHAPES = [(1, 16, 8, 128, 8192), (1, 12, 8, 128, 65536), (1, 16, 8, 128, 131072), (32, 16, 8, 128, 16384)]
HINTS = {"as emitted": "", "evict_first": ", eviction_policy='evict_first'", ".cg": ", cache_modifier='.cg'",
         "both": ", cache_modifier='.cg', eviction_policy='evict_first'"}
_orig = compute.Compute.attend_streamed
HINT = {"now": ""}


def _hinted(self, e, out, indent):
    n = len(out)
    res = _orig(self, e, out, indent)
    for i in range(n, len(out)):
        if "_tile = tl.load(" in out[i] and out[i].endswith("other=0)"):
            out[i] = out[i][:-1] + HINT["now"] + ")"
    return res


compute.Compute.attend_streamed = _hinted


def run(heap):
    out = []
    for b, hkv, g, d, s in SHAPES:
        dims = {"B": b, "HKV": hkv, "G": g, "D": d, "S": s}
        cfg = default_splits(dims, False)
        q, k, v, lens = make_inputs(dims, 1, 0, "bf16", heap.device, layout="bhsd")
        room = cfg["NS"] * cfg["L"]
        kr, vr = with_room(k, "bhsd", room), with_room(v, "bhsd", room)
        sd = time_op(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True),
                     heap, 20, 3)
        out.append(f"B{b} H{hkv * g} S{s // 1024}K NS {cfg['NS']} L {cfg['L']}: sdpa {sd.device_us:.1f} us")
        print(out[-1], flush=True)
        for name, hint in HINTS.items():
            HINT["now"] = hint
            prog = tilec.compile(SPLITS, world=1, schedule="fused-push", retype={"f16": "bf16"}, dims={**dims, **cfg},
                                 num_warps=4, num_stages=3)
            assert hint in prog.source
            args = {"Q": q, "K": kr, "V": vr, "lens": lens, "O": torch.empty_like(q)}
            ts = [time_program(prog, heap, args, 20, 2, host_iters=1).device_us for _ in range(2)]
            best = min(ts)
            out.append(f"  {name:12s} {best:8.1f} us ({ts[0]:.1f} / {ts[1]:.1f}; {sd.device_us / best:.3f}x sdpa)")
            print(out[-1], flush=True)
        del q, k, v, kr, vr
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    print("\n".join(spawn(run, 1, backend="iris", heap_bytes=1 << 30, timeout=560)[0]), flush=True)
