"""How much of a world-1 flash decode step is its merge chain? Upper bounds by patching the emitted source of the
free-split example (the bench's NS, L): as emitted; "merge to O" (the fold's local merge stores O itself: no exchange
copy through Ol/Og and no combine, what forwarding the merge's registers could at best save at world 1); "group
merge to O" (the group's last arrival merges all its heads in one tile, nobody waits); "stream
only" (the split tasks and their fold counters, no merge at all: O is not written). Each a CUDA graph replay after a
reading L2 flush beside torch SDPA (enable_gqa) in the same run, best of two.
Usage: python benchmarks/runs/decode_merge_chain/tail_bound_probe.py; TAIL_PROBE=group python ... (the group merge
unpipelined)"""
import dataclasses
import os
import re

import torch
import torch.nn.functional as F

import tilec
from tilec.perf.bench_decode import default_splits
from tilec.perf.inputs import make_inputs, with_room
from tilec.perf.measure import time_op, time_program
from tilec.runtime import spawn

SPLITS = "examples/flash_decode_splits.tile"
MODE = os.environ.get("TAIL_PROBE", "")  # "group": the group merge's unpipelined forms only
SHAPES = [(1, 12, 8, 128, 8192), (1, 16, 8, 128, 8192), (1, 12, 8, 128, 16384), (1, 16, 8, 128, 16384),
          (8, 16, 8, 128, 16384)]


def merge_to_o(src: str) -> str:
    """local_task stores its merge into O (world 1: the combine of one partial is that partial)."""
    m = re.search(r"    tl\.store\(Ol \+ (?P<off>.*?_a3_r\[None, None, :\]), tl\.reshape\(o, \((?P<shp>[^)]*)\)\)"
                  r"\.to\(tl\.float32\)\)\n.*?(?=\n\n\n@triton\.jit)", src, re.S)
    dtype = re.search(r"tl\.store\(O \+ .*\.to\((tl\.\w+)\)\)", src)[1]
    return src.replace(m[0], f"    tl.store(O + {m['off']}, tl.reshape(o, ({m['shp']})).to({dtype}))", 1)


def group_merge_to_o(src: str, dims: dict, ch: int = 8, stages: int | None = None) -> str:
    """The group's last arrival merges all G heads of its KV head in one [NS, G, D] tile and stores O (world 1); the
    other arrivals do not wait."""
    b, h, d, ns = dims["B"], dims["HKV"] * dims["G"], dims["D"], dims["NS"]
    nsp = 1 << (ns - 1).bit_length()
    dtype = re.search(r"tl\.store\(O \+ .*\.to\((tl\.\w+)\)\)", src)[1]
    g = dims["G"]
    ch = min(ch, nsp)  # partials a step: [ch, G, D] f32 in registers
    loop = f"range(0, {nsp}, {ch})" if stages is None else f"tl.range(0, {nsp}, {ch}, num_stages={stages})"
    new = f"""    if left == 0:  # the group's last arrival merges its {g} heads at once, {ch} partials a step
        hh = {g} * g + tl.arange(0, {g})
        d_r = tl.arange(0, {d})
        m_g = tl.full(({g},), float("-inf"), tl.float32)
        den_g = tl.zeros(({g},), tl.float32)
        acc_g = tl.zeros(({g}, {d}), tl.float32)
        for c in {loop}:
            s_r = c + tl.arange(0, {ch})
            os_c = tl.load(Os + s_r[:, None, None] * {b * h * d} + b * {h * d} + hh[None, :, None] * {d}
                           + d_r[None, None, :], mask=(s_r < {ns})[:, None, None], other=0)
            ls_c = tl.load(Ls + s_r[:, None] * {b * h} + b * {h} + hh[None, :], mask=(s_r < {ns})[:, None],
                           other=float("-inf"))
            m_new = tl.maximum(m_g, tl.max(ls_c, axis=0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_g - m_safe)
            w = tl.exp(ls_c - m_safe[None, :])
            den_g = den_g * alpha + tl.sum(w, axis=0)
            acc_g = acc_g * alpha[:, None] + tl.sum(w[:, :, None] * os_c, axis=0)
            m_g = m_new
        o_g = acc_g / tl.where(den_g == 0.0, 1.0, den_g)[:, None]
        tl.store(O + b * {h * d} + hh[:, None] * {d} + d_r[None, :], o_g.to({dtype}))"""
    m = re.search(r"    share = tl\.where\(.*?local_task\(t_\d+,.*?INTERPRET\)", src, re.S)
    return src.replace(m[0], new, 1)


def stream_only(src: str) -> str:
    return re.sub(r"( +)local_task\(t_\d+,.*?INTERPRET\)", r"\1pass", src, count=1, flags=re.S)


def run(heap):
    out = []
    for b, hkv, g, d, s in SHAPES:
        dims = {"B": b, "HKV": hkv, "G": g, "D": d, "S": s}
        cfg = default_splits(dims, False)
        q, k, v, lens = make_inputs(dims, 1, 0, "bf16", heap.device, layout="bhsd")
        kr, vr = with_room(k, "bhsd", cfg["NS"] * cfg["L"]), with_room(v, "bhsd", cfg["NS"] * cfg["L"])
        sd = time_op(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True),
                     heap, 20, 3)
        ref = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True).squeeze(2).float()
        out.append(f"B{b} H{hkv * g} S{s // 1024}K NS {cfg['NS']} L {cfg['L']}: sdpa {sd.device_us:.1f} us")
        print(out[-1], flush=True)
        prog0 = tilec.compile(SPLITS, world=1, schedule="fused-push", retype={"f16": "bf16"}, dims={**dims, **cfg},
                              num_warps=4, num_stages=3)
        full = {**dims, **cfg}
        variants = [("as emitted", None), ("merge to O", merge_to_o)]
        if MODE != "group":
            variants += [("group merge to O", lambda src, full=full: group_merge_to_o(src, full)),
                         ("stream only", stream_only)]
        else:  # the group merge unpipelined (no shared memory buffers for its loads), 8 or 4 partials a step
            variants += [(f"group ch {ch} stages 1", lambda src, ch=ch, full=full: group_merge_to_o(src, full, ch, 1))
                         for ch in (8, 4)]
        for name, patch in variants:
            try:
                prog = prog0 if patch is None else dataclasses.replace(prog0, source=patch(prog0.source), _state={})
                assert patch is None or prog.source != prog0.source
                o = torch.zeros_like(q)
                args = {"Q": q, "K": kr, "V": vr, "lens": lens, "O": o}
                ts = [time_program(prog, heap, args, 20, 2, host_iters=1).device_us for _ in range(2)]
                err = ((o.float() - ref).abs().max() / ref.abs().max()).item()
                best = min(ts)
                out.append(f"  {name:18s} {best:8.1f} us ({ts[0]:.1f} / {ts[1]:.1f}; {sd.device_us / best:.3f}x sdpa;"
                           f" rel err vs sdpa {err:.1e})")
            except Exception as ex:  # noqa: BLE001 - a probe: report and go on
                out.append(f"  {name:18s} failed: {str(ex).splitlines()[0][:300]}")
            print(out[-1], flush=True)
        del q, k, v, kr, vr
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    print("\n".join(spawn(run, 1, backend="iris", heap_bytes=1 << 30, timeout=560)[0]), flush=True)
