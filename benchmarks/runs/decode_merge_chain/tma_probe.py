"""Does a TMA descriptor stream K/V faster than masked pointer loads in flash decode's split loop? The free-split
example (the bench's NS, L) with its attend loads as emitted, and with each block load a `tl.make_tensor_descriptor`
load (the descriptor's rows end at the split's valid keys, so TMA zero-fills the rest as the mask did); attend blocks
of 64 and 128, pipeline stages 3 and 4. Each a CUDA graph replay after a reading L2 flush beside torch SDPA
(enable_gqa) in the same run, best of two. The loads are patched into codegen here, not in tilec.
Usage: python benchmarks/runs/decode_merge_chain/tma_probe.py"""
import re

import torch
import torch.nn.functional as F
import triton

import tilec
import tilec.codegen.compute as compute
from tilec.perf.bench_decode import default_splits
from tilec.perf.inputs import make_inputs, with_room
from tilec.perf.measure import time_op, time_program
from tilec.runtime import spawn

SPLITS = "examples/flash_decode_splits.tile"
SHAPES = [(1, 12, 8, 128, 8192), (1, 16, 8, 128, 8192), (1, 16, 8, 128, 65536), (8, 16, 8, 128, 16384),
          (1, 16, 8, 128, 262144)]
MODE = {"tma": False}
_orig = compute.Compute.attend_streamed
LOAD = re.compile(r"^(?P<ind>\s*)(?P<name>\w+) = tl\.load\((?P<ptr>\w+) \+ (?P<pre>.*?)"
                  r"\((?P<row>[^()]+) \+ (?P<kb>\w+)_r\)\[:, None\] \* (?P<stride>\d+) \+ _a\d+_r\[None, :\], "
                  r"mask=.*\)$")


def _tma(self, e, out, indent):
    n0 = len(out)
    res = _orig(self, e, out, indent)
    if not MODE["tma"]:
        return res
    k = e.args[1]
    pos = self.scope[[t for t in k.access.tile if t][0]]
    loop = next(i for i in range(n0, len(out)) if "# blocks of keys" in out[i])
    step = next(i for i in range(n0, len(out)) if "td.attend_step(" in out[i])
    count = re.search(r"td\.attend_step\([^,]+, [^,]+, [^,]+, (.+?) - \w+, ", out[step])[1]  # (q, k, v, n - kb, ..
    blk = self.attend_block
    descs = []
    for i in range(loop, step):
        m = LOAD.match(out[i])
        if not m:
            continue
        d = f"{m['name']}_desc"
        rows = f"tl.maximum(tl.minimum(tl.max({count} + tl.zeros((1,), tl.int32), axis=0), {pos.extent}), 0)"
        descs.append(f"{indent}{d} = tl.make_tensor_descriptor({m['ptr']} + {m['pre']}({m['row']}) * {m['stride']},"
                     f" shape=[{rows}, {m['stride']}], strides=[{m['stride']}, 1], block_shape=[{blk}, {m['stride']}])")
        out[i] = f"{m['ind']}{m['name']} = {d}.load([{pos.name} + {m['kb']}, 0])"
    assert len(descs) == 2, out[loop:step]
    out[loop:loop] = descs
    return res


compute.Compute.attend_streamed = _tma


def run(heap):
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
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
        ref = None
        for tma, blk, stages in [(False, 64, 3), (True, 64, 3), (True, 64, 4), (True, 128, 3)]:
            MODE["tma"] = tma
            name = f"{'tma' if tma else 'pointers'} block {blk} stages {stages}"
            try:
                prog = tilec.compile(SPLITS, world=1, schedule="fused-push", retype={"f16": "bf16"},
                                     dims={**dims, **cfg}, num_warps=4, num_stages=stages, attend_block=blk)
                assert ("make_tensor_descriptor" in prog.source) == tma
                o = torch.empty_like(q)
                args = {"Q": q, "K": kr, "V": vr, "lens": lens, "O": o}
                ts = [time_program(prog, heap, args, 20, 2, host_iters=1).device_us for _ in range(2)]
                if ref is None:
                    ref = o.float().clone()
                err = ((o.float() - ref).abs().max() / ref.abs().max()).item()
                best = min(ts)
                out.append(f"  {name:28s} {best:8.1f} us ({ts[0]:.1f} / {ts[1]:.1f}; {sd.device_us / best:.3f}x sdpa;"
                           f" vs pointers rel err {err:.1e})")
            except Exception as ex:  # noqa: BLE001 - a probe: report and go on
                out.append(f"  {name:28s} failed: {str(ex).splitlines()[0][:200]}")
            print(out[-1], flush=True)
        del q, k, v, kr, vr
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    print("\n".join(spawn(run, 1, backend="iris", heap_bytes=1 << 30, timeout=560)[0]), flush=True)
