"""Probe: which emitted form of the streamed attend's key loop streams fastest, timed as bsp's local phase (split +
merge kernels, `only=`, kernel_time: do_bench when it ran in call 27, a clean cold-L2 flush since) of
examples/flash_decode.tile at B=1, D=128, GQA 8:1, bf16, head-major KV.

Call 26 found every decode row 10-15% slower after v stopped being re-masked, while the hand-written probe
(decode_stream_probe.py) had found that change 2-7% faster. The emitted loads were [1, 1, keys, D] blocks reshaped
to [keys, D] before the dots; the probe's were [keys, D]. Variants, made from the emitted source:
- 2d zeroed: [keys, D] loads, v as loaded (what the emitter writes now);
- 2d where: [keys, D] loads, v re-masked;
- 4d zeroed: [1, 1, keys, D] loads reshaped, v as loaded (call 26);
- 4d where: [1, 1, keys, D] loads reshaped, v re-masked (call 21 and before).
Run on the device: python benchmarks/decode_emit_probe.py > probe.log
"""

from __future__ import annotations

import dataclasses
import re
import sys

import torch

import tilec
from tilec.bench_decode import COPY_GBPS, copy_gbps, default_bs, kv_bytes, local_phase_time, make_inputs
from tilec.runtime import spawn

EX = "examples/flash_decode.tile"
SHAPES = ((12, 32768), (16, 32768), (12, 131072), (12, 1048576))  # (HKV, S)
KV_LOAD = re.compile(r"^(\s+)(\w+) = tl\.load\((K|V) \+ .*\)\[:, None\].*$")


def four_d(src: str) -> str:
    """The key loop's [keys, D] K/V loads as [1, 1, keys, D] loads reshaped before the dot (the old form)."""
    out, names = [], []
    for line in src.splitlines():
        m = KV_LOAD.match(line)
        if m:
            line = line.replace("[:, None]", "[None, None, :, None]").replace("_r[None, :]", "_r[None, None, None, :]")
            names.append(m[2])
        elif names and "td.attend_step(" in line:
            for n in names:
                line = line.replace(f", {n},", f", tl.reshape({n}, (64, 128)),")
            names = []
        out.append(line)
    return "\n".join(out) + "\n"


def variants(prog):
    src = prog.source
    assert "UPCAST_DOT, True)" in src
    where = src.replace("UPCAST_DOT, True)", "UPCAST_DOT, False)")
    for name, s in (("2d zeroed", src), ("2d where", where), ("4d zeroed", four_d(src)), ("4d where", four_d(where))):
        yield name, dataclasses.replace(prog, source=s, _state={})


def probe(heap):
    for hkv, s in SHAPES:
        dims = dict(B=1, HKV=hkv, G=8, D=128, S=s)
        bs = default_bs(dims, False)
        q, k, v, lens = make_inputs(dims, 1, 0, "bf16", heap.device, layout="bhsd")
        print(f"H={hkv * 8} S={s} BS={bs}: copy of K {copy_gbps(k, heap, 20):.0f} GB/s (read + write)", flush=True)
        prog = tilec.compile(EX, world=1, schedule="bsp", dims={**dims, "BS": bs}, retype={"f16": "bf16"})
        ref = None
        for name, p in variants(prog):
            try:
                args = dict(Q=q, K=k, V=v, lens=lens, O=torch.empty(q.shape, dtype=q.dtype, device=heap.device))
                p(heap, **args)
                ref = args["O"].float() if ref is None else ref
                err = float((args["O"].float() - ref).abs().max())
                secs = local_phase_time(p, heap, args, 20)
                gbps = kv_bytes(dims, "bf16") / secs / 1e9
                print(f"H={hkv * 8} S={s} BS={bs} {name:9s}: local phase {secs * 1e6:7.1f} us {gbps:5.0f} GB/s "
                      f"({gbps / COPY_GBPS:.2f} of {COPY_GBPS:.0f}); max diff to the first {err:.1e}", flush=True)
            except Exception as e:  # noqa: BLE001 - a probe: report and go on
                print(f"H={hkv * 8} S={s} {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    spawn("benchmarks.decode_emit_probe:probe", 1, backend="iris", heap_bytes=1 << 28, timeout=600)
    sys.exit(0)
