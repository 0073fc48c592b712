"""World-1 config sweep of one flash-decode program (fused-push): split size BS, heads per tail task BH, attend
block, each a CUDA graph replay after a reading L2 flush (perf.measure) beside torch SDPA (enable_gqa) of the same run.
BH > 1 rows need a program with tile BH (the committed log used commit a1a89aa's example: the tail stages over
`h in HKV*G by BH`).
Usage: python benchmarks/runs/decode_configs/decode_cfg_probe.py PROGRAM.tile [--programs-per-sm N]"""
import argparse
import itertools
import os

import torch
import torch.nn.functional as F

import tilec
from tilec.perf.inputs import make_inputs
from tilec.perf.measure import time_op, time_program
from tilec.runtime import spawn

SWEEP = {  # (B, HKV, G, D, S): (BS, BH, attend block) candidates; warps 4, stages 3 (the bench's)
    (1, 16, 8, 128, 8192): ((512, 1024), (1,), (64, 128)),
    (8, 16, 8, 128, 16384): ((4096, 8192), (1, 8), (64,)),
}
if os.environ.get("DECODE_SWEEP") == "64k":  # 192 tasks at BS 4096 leave 72 of 132 SMs one task; 384 at 2048
    SWEEP = {(1, 12, 8, 128, 65536): ((2048, 4096), (1,), (64,)),  # fill 3 programs a SM (--programs-per-sm 3)
             (1, 16, 8, 128, 8192): ((256, 512), (1,), (64,))}


def run(heap, path, programs_per_sm):
    out = []
    for (b, hkv, g, d, s), (bss, bhs, blks) in SWEEP.items():
        dims = {"B": b, "HKV": hkv, "G": g, "D": d, "S": s}
        q, k, v, lens = make_inputs(dims, 1, 0, "bf16", heap.device, layout="bhsd")
        sd = time_op(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True),
                     heap, 20, 3)
        ref = F.scaled_dot_product_attention(q.unsqueeze(2).float(), k.float(), v.float(), enable_gqa=True)
        out.append(f"B{b} H{hkv * g} S{s // 1024}K: sdpa {sd.device_us:.1f} us")
        for bs, bh, blk in itertools.product(bss, bhs, blks):
            warps, stages = 4, 3
            try:
                prog = tilec.compile(path, world=1, schedule="fused-push", retype={"f16": "bf16"},
                                     dims={**dims, "BS": bs, **({"BH": bh} if bh > 1 else {})}, attend_block=blk,
                                     num_warps=warps, num_stages=stages, programs_per_sm=programs_per_sm)
                args = {"Q": q, "K": k, "V": v, "lens": lens, "O": torch.empty_like(q)}
                t = time_program(prog, heap, args, 20, 2, host_iters=1)
            except Exception as e:  # noqa: BLE001 - a config that does not compile is a row, not the end
                out.append(f"  BS {bs:5d} BH {bh} blk {blk:3d}: {type(e).__name__}: {str(e)[:80]}")
                continue
            err = ((args["O"].float() - ref.squeeze(2)).abs().max() / ref.abs().max()).item()
            out.append(f"  BS {bs:5d} BH {bh} blk {blk:3d}: {t.device_us:7.1f} us "
                       f"({sd.device_us / t.device_us:.3f}x sdpa) err {err:.1e}")
            print(out[-1], flush=True)
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("program")
    ap.add_argument("--programs-per-sm", type=int, metavar="N", help="the compile option (default: tilec.compile's)")
    a = ap.parse_args()
    print("\n".join(spawn(run, 1, backend="iris", heap_bytes=1 << 30, timeout=560,
                          args=(a.program, a.programs_per_sm))[0]), flush=True)
