"""One generated program of tests/gen_programs.py on backend nvshmem, one schedule, a short launch timeout: where a
run of the family hangs, which settings it hangs under and where each rank is (spawn prints every rank's Python
stack when it gives up).

    sh benchmarks/runs/mps_world.sh --spawn 4 python3 benchmarks/runs/nvshmem_generated_probe.py \\
        --world 4 --ranks-per-node 1 --focus push --seed 100 --schedule flags [--option claim=off ...]

Prints one line: OK or FAILED, the arguments, the seconds, and the error.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2])]


def main() -> None:
    import tilec
    from tests import _workers
    from tests._util import make_calls
    from tests.gen_programs import generate
    from tilec.runtime import spawn

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=4)
    ap.add_argument("--ranks-per-node", type=int, default=1)
    ap.add_argument("--focus", default="push", help="a focus of tests/gen_programs.py ('' for the plain family)")
    ap.add_argument("--seed", type=int, default=100)
    ap.add_argument("--schedule", default="flags")
    ap.add_argument("--option", action="append", default=[], help="NAME=VALUE, a tilec.compile option")
    ap.add_argument("--wait-timeout", type=float, default=5.0)
    ap.add_argument("--heap", default="nvshmem", help="the ranks' heap: nvshmem, or cpu (the emulation, no GPU)")
    ap.add_argument("--timeout", type=float, default=40.0, help="the launch's limit (spawn's timeout), seconds")
    a = ap.parse_args()
    opts = {k: (int(v) if v.isdigit() else v) for k, v in (o.split("=", 1) for o in a.option)}
    g = generate(a.seed, a.world, focus=a.focus or True)
    prog = tilec.compile(f"tests/generated/{g.name}.tile", a.world, a.schedule, source=g.text, backend="nvshmem",
                         ranks_per_node=a.ranks_per_node, wait_timeout=a.wait_timeout, **opts)
    batch = [((g.name, a.schedule), prog, make_calls(prog, 1, seed=0), g.plain)]
    t0 = time.monotonic()
    try:
        spawn(_workers.run_cases, a.world, backend=a.heap, heap_bytes=1 << 26, timeout=a.timeout, args=(batch,))
        print("OK", sys.argv[1:], f"{time.monotonic() - t0:.1f}s", flush=True)
    except Exception as e:  # noqa: BLE001 - the probe reports any failure in one line
        print("FAILED", sys.argv[1:], f"{time.monotonic() - t0:.1f}s", type(e).__name__, str(e)[:600], flush=True)


if __name__ == "__main__":
    main()
