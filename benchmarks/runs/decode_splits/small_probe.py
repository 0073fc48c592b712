"""World-1 probe of the short decode steps (8K-16K keys), where SDPA still leads: the free-split example under
split counts, attend blocks, warps and pipeline stages, each a CUDA graph replay after a reading L2 flush beside
torch SDPA (enable_gqa) in the same run; and a one-element add as the floor of a replayed graph.
Usage: python benchmarks/runs/decode_splits/small_probe.py [--pdl on|off]"""
import argparse
import os

import torch
import torch.nn.functional as F

import tilec
from tilec.perf.inputs import make_inputs, with_room
from tilec.perf.measure import time_op, time_program
from tilec.runtime import spawn

SPLITS = "examples/flash_decode_splits.tile"
# (B, HKV, G, D, S): [(NS, attend block, warps, stages)]
SWEEP = {
    (1, 16, 8, 128, 8192): [(16, 64, 4, 3), (16, 32, 4, 3), (16, 64, 4, 2), (16, 64, 4, 4), (16, 64, 8, 3),
                            (8, 64, 4, 3), (8, 64, 8, 3), (16, 128, 8, 3)],
    (1, 12, 8, 128, 8192): [(22, 64, 4, 3), (22, 32, 4, 3), (22, 64, 4, 4), (11, 64, 8, 3)],
    (1, 16, 8, 128, 16384): [(16, 64, 4, 3), (16, 64, 4, 4), (16, 64, 8, 3)],
}

if os.environ.get("SMALL_SWEEP") == "one":  # the default config at 8K only (with --pdl off, say)
    SWEEP = {(1, 16, 8, 128, 8192): [(16, 64, 4, 3)]}


def run(heap, pdl):
    out = []
    x = torch.zeros(1, device=heap.device)
    t0 = time_op(lambda: x.add_(1), heap, 20, 3)
    out.append(f"a replayed graph of one add: {t0.device_us:.1f} us")
    print(out[-1], flush=True)
    for (b, hkv, g, d, s), cfgs in SWEEP.items():
        dims = {"B": b, "HKV": hkv, "G": g, "D": d, "S": s}
        q, k, v, lens = make_inputs(dims, 1, 0, "bf16", heap.device, layout="bhsd")
        sd = time_op(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True),
                     heap, 20, 3)
        ref = F.scaled_dot_product_attention(q.unsqueeze(2).float(), k.float(), v.float(), enable_gqa=True).squeeze(2)
        out.append(f"B{b} H{hkv * g} S{s // 1024}K: sdpa {sd.device_us:.1f} us")
        print(out[-1], flush=True)
        for ns, blk, warps, stages in cfgs:
            length = -(-s // (ns * 64)) * 64
            cd = {**dims, "NS": ns, "L": length, "BS": 1 << (length - 1).bit_length()}
            try:
                prog = tilec.compile(SPLITS, world=1, schedule="fused-push", retype={"f16": "bf16"}, dims=cd,
                                     attend_block=blk, num_warps=warps, num_stages=stages, pdl=pdl)
                room = ns * length
                args = {"Q": q, "K": with_room(k, "bhsd", room), "V": with_room(v, "bhsd", room), "lens": lens,
                        "O": torch.empty_like(q)}
                t = time_program(prog, heap, args, 20, 2, host_iters=1)
                t2 = time_program(prog, heap, args, 20, 2, host_iters=1)
            except Exception as e:  # noqa: BLE001 - a config that does not compile is a row, not the end
                what = f"NS {ns:2d} blk {blk:3d} warps {warps} stages {stages}"
                out.append(f"  {what}: {type(e).__name__}: {str(e)[:80]}")
                print(out[-1], flush=True)
                continue
            err = ((args["O"].float() - ref).abs().max() / ref.abs().max()).item()
            best = min(t.device_us, t2.device_us)
            out.append(f"  NS {ns:2d} blk {blk:3d} warps {warps} stages {stages}: {best:6.1f} us "
                       f"({t.device_us:.1f} / {t2.device_us:.1f}; {sd.device_us / best:.3f}x sdpa) err {err:.1e}")
            print(out[-1], flush=True)
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--pdl", choices=("on", "off"), default="on", help="programmatic dependent launch (the option)")
    pdl = ap.parse_args().pdl == "on"
    print("\n".join(spawn(run, 1, backend="iris", heap_bytes=1 << 30, timeout=560, args=(pdl,))[0]), flush=True)
