"""AG+GEMM 8192x4608x36864 at world W (default 2) on one GPU under MPS: bsp, fused-pull and fused-push timed as
`tilec taxes --measure` times them (median of 20 calls, entry barrier included, slowest rank), with tilec bench's
Hopper tiles; the persistent loops claim their tasks (the default under MPS; --claim off for the static stride).
Run: sh benchmarks/runs/mps_world.sh --spawn 2 python3 benchmarks/runs/mps_claims.py [W] [--claim auto|on|off]"""

import argparse

from tilec.perf.bench import measured_tiles
from tilec.perf.taxes import Skipped, compile_all, measure_times

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("world", nargs="?", type=int, default=2)
    ap.add_argument("--claim", choices=("auto", "on", "off"), default="auto")
    args = ap.parse_args()
    path = "examples/ag_gemm.tile"
    dims, launch, text = measured_tiles(path, args.world, {"M": 8192, "N": 4608, "K": 36864}, {})
    launch = {**launch, "claim": args.claim}
    progs = [p for p in compile_all(path, args.world, dims, ("bsp", "fused-pull", "fused-push"), launch=launch)
             if not isinstance(p, Skipped)]
    print(text, f"--claim {args.claim}", flush=True)
    for s, (us, note) in measure_times(progs).items():
        print(f"{s:<12}{us:10.0f} us   {note}", flush=True)
