"""Shared by the split-stage probes (decode_flat_probe.py, decode_stream_probe.py): the generated attend helpers,
one shape's inputs with a copy of K timed beside them, and one timed kernel checked against torch."""

from __future__ import annotations

import math

import torch
from triton.testing import do_bench

import tilec.device as td

G, D = 8, 128  # query heads per KV head, head dim
attend_init, attend_step, attend_finish = td.attend_init, td.attend_step, td.attend_finish


class Shape:
    """q [H, D], k and v [HKV, S, D] (bf16, head-major) on the GPU, a copy of K timed (read + write bytes per
    second) and the f32 reference output."""

    def __init__(self, s: int, hkv: int):
        dev = torch.device("cuda")
        self.s, self.hkv, self.h = s, hkv, hkv * G
        torch.manual_seed(0)
        self.q = torch.randn(self.h, D, device=dev, dtype=torch.bfloat16)
        self.k = torch.randn(hkv, s, D, device=dev, dtype=torch.bfloat16)
        self.v = torch.randn(hkv, s, D, device=dev, dtype=torch.bfloat16)
        self.nbytes = 2 * self.k.numel() * self.k.element_size()
        dst = torch.empty_like(self.k)
        secs = do_bench(lambda: dst.copy_(self.k), warmup=5, rep=40, return_mode="median") / 1e3
        self.copy = self.nbytes / secs
        print(f"S={s} H={self.h}: copy of K {self.copy / 1e9:.0f} GB/s (read + write)", flush=True)
        ref = torch.softmax((self.q.view(hkv, G, D).float() @ self.k.float().transpose(1, 2)) / math.sqrt(D), -1)
        self.ref = (ref @ self.v.float()).view(self.h, D)

    def partials(self, bs: int):
        ns = self.s // bs
        return (torch.empty(ns, self.h, D, device=self.q.device, dtype=torch.float32),
                torch.empty(ns, self.h, device=self.q.device, dtype=torch.float32))

    def time(self, label: str, go, os_, ls) -> None:
        """Runs `go` (one launch writing the split partials os_, ls), checks their merge against the reference,
        prints its do_bench time as a share of 4.2 TB/s and of the copy."""
        try:
            os_.zero_()
            go()
            err = ((torch.softmax(ls, 0)[..., None] * os_).sum(0) - self.ref).abs().max().item()
            us = do_bench(go, warmup=5, rep=40, return_mode="median") * 1e3
            gbps = self.nbytes / us / 1e3
            print(f"S={self.s} H={self.h} {label}: {us:6.1f} us {gbps:5.0f} GB/s = {gbps / 4200:.2f} of 4.2 TB/s, "
                  f"{gbps * 1e9 / self.copy:.2f} of the copy; max err {err:.1e}", flush=True)
        except Exception as e:  # noqa: BLE001 - a probe: report and go on
            print(f"S={self.s} H={self.h} {label}: {type(e).__name__}: {str(e)[:300]}", flush=True)
