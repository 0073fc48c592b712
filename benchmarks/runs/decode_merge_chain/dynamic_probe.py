"""Would dynamic task claims balance flash decode's split stage? At 8K keys the 264 equal split tasks of 96 heads end
between 13.9 (p10) and 16.9 us (the timeline in results/h200-1gpu/decode_splits/): some programs stream slower. Here
the free-split example with more splits than programs (NS x2, x3, x4) and the persistent loop patched to claim its
next task from a counter (`atomic_add`, epoch-based like the flags: every call adds exactly the task count) instead
of `range(pid, N, NPROG)`; the shared fold keeps its share (safe: claims are in task order and a fold's group is
contiguous, so at most share-1 programs wait on a group that has unclaimed tasks) or drops to 1. Each a CUDA graph
replay after a reading L2 flush beside torch SDPA (enable_gqa) in the same run, best of two; outputs checked against
SDPA. Usage: python benchmarks/runs/decode_merge_chain/dynamic_probe.py"""
import dataclasses
import re

import torch
import torch.nn.functional as F

import tilec
from tilec.perf.bench_decode import default_splits
from tilec.perf.inputs import make_inputs, with_room
from tilec.perf.measure import time_op, time_program
from tilec.runtime import spawn

SPLITS = "examples/flash_decode_splits.tile"
SHAPES = [(1, 12, 8, 128, 8192), (1, 16, 8, 128, 8192), (1, 12, 8, 128, 16384), (1, 16, 8, 128, 16384),
          (8, 16, 8, 128, 16384), (1, 16, 8, 128, 65536)]


def dynamic(src: str, share: bool) -> str:
    """The persistent loop claims tasks from a counter (F_claim, one more flag) instead of striding by NPROG."""
    n = int(re.search(r"for task in range\(pid, (\d+), NPROG\):", src)[1])
    head = re.search(r"def (k0_\w+)\(([^)]*)\):", src)
    params = head[2].replace(" ERR,", " F_claim, ERR,", 1)
    src = src.replace(head[0], f"def {head[1]}({params}):", 1)
    loop = re.search(r"    for task in range\(pid, \d+, NPROG\):\n(.*?)\n    td\.leave", src, re.S)
    new = (f"    task = pid\n    while task < {n}:\n{loop[1]}\n"
           f"        task = tl.atomic_add(F_claim, 1, sem=\"relaxed\") - (epoch - 1) * {n} + NPROG\n    td.leave")
    src = src.replace(loop[0], new, 1)
    src = re.sub(r'(KERNELS = \[\n    \(k0_\w+, .*?\[.*?"O")\]', r'\1, "F_claim"]', src, count=1, flags=re.S)
    src = src.replace("FLAGS = {\n", f'FLAGS = {{\n    "F_claim": (1, {n}, "split", "claim", 1),\n', 1)
    if share:
        src = re.sub(r"share = tl\.where\(tl\.num_programs\(0\) >= \d+, (\d+), 1\)", r"share = \1", src)
    return src


def run(heap):
    out = []
    for b, hkv, g, d, s in SHAPES:
        dims = {"B": b, "HKV": hkv, "G": g, "D": d, "S": s}
        base = default_splits(dims, False)
        q, k, v, lens = make_inputs(dims, 1, 0, "bf16", heap.device, layout="bhsd")
        sd = time_op(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True),
                     heap, 20, 3)
        ref = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True).squeeze(2).float()
        out.append(f"B{b} H{hkv * g} S{s // 1024}K default NS {base['NS']} L {base['L']}: sdpa {sd.device_us:.1f} us")
        print(out[-1], flush=True)
        for mult, mode in [(1, "static"), (2, "static"), (2, "dynamic"), (2, "dynamic share1"), (3, "dynamic"),
                           (4, "dynamic")]:
            ns = base["NS"] * mult
            per = -(-s // ns)
            lk = -(-per // 64) * 64  # ceil(S / NS) up to a multiple of 64
            cfg = {"NS": ns, "L": lk, "BS": 1 << (lk - 1).bit_length()}
            name = f"NS {ns:3d} L {lk:5d} {mode}"
            try:
                kr, vr = with_room(k, "bhsd", ns * lk), with_room(v, "bhsd", ns * lk)
                prog = tilec.compile(SPLITS, world=1, schedule="fused-push", retype={"f16": "bf16"},
                                     dims={**dims, **cfg}, num_warps=4, num_stages=3)
                if mode != "static":
                    prog = dataclasses.replace(prog, source=dynamic(prog.source, mode == "dynamic"), _state={})
                o = torch.empty_like(q)
                args = {"Q": q, "K": kr, "V": vr, "lens": lens, "O": o}
                ts = [time_program(prog, heap, args, 20, 2, host_iters=1).device_us for _ in range(2)]
                err = ((o.float() - ref).abs().max() / ref.abs().max()).item()
                best = min(ts)
                out.append(f"  {name:28s} {best:8.1f} us ({ts[0]:.1f} / {ts[1]:.1f}; {sd.device_us / best:.3f}x sdpa;"
                           f" rel err vs sdpa {err:.1e})")
                del kr, vr
            except Exception as ex:  # noqa: BLE001 - a probe: report and go on
                out.append(f"  {name:28s} failed: {str(ex).splitlines()[0][:300]}")
            print(out[-1], flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    print("\n".join(spawn(run, 1, backend="iris", heap_bytes=1 << 30, timeout=560)[0]), flush=True)
