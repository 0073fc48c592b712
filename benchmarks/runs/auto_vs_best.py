"""Per shape of a `tilec bench` JSON with an `auto` row: the variant auto picked, its time, the fastest tilec row
and auto's time over it (the target: within 3%). Usage: python benchmarks/runs/auto_vs_best.py FILE.json..."""

import json
import sys


def main(paths: list[str]) -> int:
    worst = 0.0
    for path in paths:
        rows = json.load(open(path))["rows"]
        shapes = list(dict.fromkeys(json.dumps(r["shape"]) for r in rows))
        for sh in shapes:
            tilec = [r for r in rows if json.dumps(r["shape"]) == sh and r["kind"] == "tilec"]
            auto = next((r for r in tilec if r["name"] == "auto"), None)
            others = [r for r in tilec if r["name"] != "auto"]
            if auto is None or not others:
                continue
            best = min(others, key=lambda r: r["device_us"])
            ratio = auto["device_us"] / best["device_us"]
            worst = max(worst, ratio)
            print(f"{path}: {json.loads(sh)}: auto ({auto.get('note', '')}) {auto['device_us']:.0f} us, best"
                  f" {best['name']} {best['device_us']:.0f} us, auto/best {ratio:.3f}")
    print(f"worst auto/best: {worst:.3f} (target <= 1.03)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
