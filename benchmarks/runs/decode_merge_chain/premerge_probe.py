"""Would merging while waiting shorten flash decode's tail at world 1? The free-split example (the bench's NS, L,
batch 1) patched so every split publishes a ready flag for its partial (release) before it arrives; the group's
last G arrivals but the very last each take one query head and, while the others still stream, poll the group's
ready flags and fold each partial into an online merge as it appears; after the last arrival only its partial is
left to load. The very last arrival merges nothing. As emitted beside it, and torch SDPA (enable_gqa) in the same
run; CUDA graph replays after a reading L2 flush, best of two.
Usage: python benchmarks/runs/decode_merge_chain/premerge_probe.py"""
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
          (1, 16, 8, 128, 65536)]


def premerge(src: str, dims: dict) -> str:
    h, d, ns, g = dims["HKV"] * dims["G"], dims["D"], dims["NS"], dims["G"]
    assert dims["B"] == 1 and ns > g, dims
    nsp = 1 << (ns - 1).bit_length()
    m = re.search(r"    left = td\.arrive_left\((?P<flag>\w+) \+ (?P<cnt>[^,]+), epoch \* \d+\).*?"
                  r"tl\.num_programs\(0\) >= (?P<n>\d+).*?"
                  r"local_task\(t_\d+,.*?INTERPRET\)", src, re.S)
    xcall = re.search(r"exchange_task\(h_2, (?P<args>.*?INTERPRET)\)", src, re.S)["args"]
    new = f"""    tl.atomic_xchg(F_ready + ({m['cnt']}) * {ns} + j, epoch, sem="release", scope="gpu")  # j is out
    left = td.arrive_left({m['flag']} + {m['cnt']}, epoch * {ns})  # arrivals still to come
    # one query head each, merged as its partials appear (only when every task has a running program; a probe: no
    # fallback, the output check shows it), polling at most 2M rounds (no hang if a flag never comes)
    if (left >= 1) & (left <= {g}) & (tl.num_programs(0) >= {m['n']}):
        hh = {g} * g + left - 1
        s_r = tl.arange(0, {nsp})
        d_r = tl.arange(0, {d})
        seen = s_r >= {ns}
        polls = 0
        m_h = tl.full((1,), float("-inf"), tl.float32)
        den_h = tl.zeros((1,), tl.float32)
        acc_h = tl.zeros(({d},), tl.float32)
        while (tl.min(seen.to(tl.int32), axis=0) == 0) & (polls < 2000000):
            polls += 1
            rd = tl.atomic_add(F_ready + ({m['cnt']}) * {ns} + s_r, 0, mask=s_r < {ns}, sem="acquire", scope="gpu")
            new = (rd >= epoch) & (seen == 0)
            os_n = tl.load(Os + s_r[:, None] * {h * d} + hh * {d} + d_r[None, :], mask=new[:, None], other=0)
            ls_n = tl.load(Ls + s_r * {h} + hh, mask=new, other=float("-inf"))
            m_new = tl.maximum(m_h, tl.max(ls_n, axis=0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_h - m_safe)
            w = tl.exp(ls_n - m_safe)
            den_h = den_h * alpha + tl.sum(w, axis=0)
            acc_h = acc_h * alpha + tl.sum(w[:, None] * os_n, axis=0)
            m_h = m_new
            seen = seen | new
        o_h = acc_h / tl.where(den_h == 0.0, 1.0, den_h)
        lse_h = tl.where(den_h == 0.0, float("-inf"), m_h + tl.log(tl.where(den_h == 0.0, 1.0, den_h)))
        tl.store(Ol + hh * {d} + d_r, o_h)
        tl.store(Ll + hh + tl.zeros((1,), dtype=tl.int32), lse_h)
        tl.debug_barrier()
        exchange_task(hh, {xcall})"""
    src = src.replace(m[0], new, 1)
    head = re.search(r"def (split_task)\(([^)]*)\):", src)
    src = src.replace(head[0], f"def {head[1]}({head[2].replace(' ERR,', ' F_ready, ERR,', 1)}):", 1)
    src = re.sub(r"split_task\((task[^)]*?) ERR,", r"split_task(\1 F_ready, ERR,", src, count=1, flags=re.S)
    k0 = re.search(r"def (k0_\w+)\(([^)]*)\):", src)
    src = src.replace(k0[0], f"def {k0[1]}({k0[2].replace(' ERR,', ' F_ready, ERR,', 1)}):", 1)
    src = re.sub(r'(KERNELS = \[\n    \(k0_\w+, .*?\[.*?"O")\]', r'\1, "F_ready"]', src, count=1, flags=re.S)
    groups = dims["B"] * dims["HKV"]
    return src.replace("FLAGS = {\n", f'FLAGS = {{\n    "F_ready": ({groups * ns}, 1, "split", "ready", 1),\n', 1)


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
        for name in ("as emitted", "merge while waiting"):
            try:
                prog = prog0 if name == "as emitted" else dataclasses.replace(
                    prog0, source=premerge(prog0.source, {**dims, **cfg}), _state={})
                o = torch.zeros_like(q)
                args = {"Q": q, "K": kr, "V": vr, "lens": lens, "O": o}
                ts = [time_program(prog, heap, args, 20, 2, host_iters=1).device_us for _ in range(2)]
                err = ((o.float() - ref).abs().max() / ref.abs().max()).item()
                best = min(ts)
                out.append(f"  {name:20s} {best:8.1f} us ({ts[0]:.1f} / {ts[1]:.1f}; {sd.device_us / best:.3f}x sdpa;"
                           f" rel err vs sdpa {err:.1e})")
            except Exception as ex:  # noqa: BLE001 - a probe: report and go on
                out.append(f"  {name:20s} failed: {str(ex).splitlines()[0][:300]}")
            print(out[-1], flush=True)
        del q, k, v, kr, vr
        torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    print("\n".join(spawn(run, 1, backend="iris", heap_bytes=1 << 30, timeout=560)[0]), flush=True)
