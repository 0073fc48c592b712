"""World-1 probe: flash decode with splits that are not a power of two (benchmarks/runs/decode_splits/
flash_decode_ragged.tile: NS splits of L keys, capacity S = NS * L >= the keys, lens = the keys, so the last split
is short) against the example's power-of-two splits and torch SDPA (enable_gqa) on the same keys, each a CUDA graph
replay after a reading L2 flush (perf.measure). Usage: python benchmarks/runs/decode_splits/ragged_probe.py"""
import os

import torch
import torch.nn.functional as F

import tilec
from tilec.perf.inputs import make_inputs
from tilec.perf.measure import time_op, time_program
from tilec.runtime import spawn

RAGGED = "benchmarks/runs/decode_splits/flash_decode_ragged.tile"  # since folded into
# examples/flash_decode_splits.tile (with room past S and NS a dim); the file as run is in the git history
EXAMPLE = "examples/flash_decode.tile"
# (B, HKV, G, D, keys): power-of-two BS of the example, then ragged split counts NS (L: keys / NS rounded up to
# the 64-key attend block)
SWEEP = {
    (1, 12, 8, 128, 8192): ((512,), (22, 11)),
    (1, 12, 8, 128, 65536): ((4096,), (22, 11)),
    (1, 12, 8, 128, 131072): ((8192,), (22,)),
    (1, 12, 8, 128, 262144): ((16384,), (22,)),
    (8, 16, 8, 128, 16384): ((8192,), (2,)),
}
if os.environ.get("RAGGED_QUICK"):
    SWEEP = {k: v for k, v in SWEEP.items() if k[4] in (16384, 65536)}


def _pow2(n):
    return 1 << (n - 1).bit_length()


def run(heap):
    out = []
    for (b, hkv, g, d, keys), (bss, rag) in SWEEP.items():
        dims = {"B": b, "HKV": hkv, "G": g, "D": d, "S": keys}
        q, k, v, lens = make_inputs(dims, 1, 0, "bf16", heap.device, layout="bhsd")
        sd = time_op(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True),
                     heap, 20, 3)
        ref = F.scaled_dot_product_attention(q.unsqueeze(2).float(), k.float(), v.float(), enable_gqa=True).squeeze(2)
        out.append(f"B{b} H{hkv * g} S{keys // 1024}K: sdpa {sd.device_us:.1f} us")
        print(out[-1], flush=True)
        cfgs = [("pow2", EXAMPLE, {**dims, "BS": bs}, bs) for bs in bss]
        ls = [(-(-keys // (ns * 64)) * 64, ns) for ns in rag]
        cfgs += [("ragged", RAGGED, {**dims, "S": ns * L, "L": L, "BS": _pow2(L)}, (L, ns)) for L, ns in ls]
        cfgs += [("pow2", EXAMPLE, {**dims, "BS": bs}, bs) for bs in bss]  # again: does the order matter?
        for kind, path, cdims, what in cfgs:
            try:
                prog = tilec.compile(path, world=1, schedule="fused-push", retype={"f16": "bf16"}, dims=cdims,
                                     num_warps=4, num_stages=3)
                if True:  # a cache of capacity NS * L holding the same keys (the rest never read); the same
                    # allocation for the power-of-two rows (where the tensors sit changes the time: placement_probe)
                    kc = torch.zeros((b, hkv, cdims["S"], d), device=heap.device, dtype=k.dtype)
                    vc = torch.zeros_like(kc)
                    kc[:, :, :keys] = k
                    vc[:, :, :keys] = v
                else:
                    kc, vc = k, v
                args = {"Q": q, "K": kc, "V": vc, "lens": lens, "O": torch.empty_like(q)}
                t = time_program(prog, heap, args, 20, 2, host_iters=1)
            except Exception as e:  # noqa: BLE001 - a config that does not compile is a row, not the end
                out.append(f"  {kind} {what}: {type(e).__name__}: {str(e)[:160]}")
                print(out[-1], flush=True)
                continue
            err = ((args["O"].float() - ref).abs().max() / ref.abs().max()).item()
            tasks = b * hkv * (cdims["S"] // cdims.get("L", cdims["BS"]))
            out.append(f"  {kind:6s} {str(what):12s} {tasks:4d} split tasks: {t.device_us:7.1f} us "
                       f"(p10 {t.p10_us:.1f} p90 {t.p90_us:.1f}; {sd.device_us / t.device_us:.3f}x sdpa) err {err:.1e}")
            print(out[-1], flush=True)
            del args, kc, vc
        del q, k, v
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    print("\n".join(spawn(run, 1, backend="iris", heap_bytes=1 << 30, timeout=560)[0]), flush=True)
