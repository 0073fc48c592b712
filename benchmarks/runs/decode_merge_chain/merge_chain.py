"""Per KV head group of a flash decode timeline trace (`tilec taxes ... --timeline --trace FILE`): when its splits
end, and how long after the group's last split its local merges start and end and its combines end. Shows the
merge chain a world-1 step pays after the stream.
Usage: python benchmarks/runs/decode_merge_chain/merge_chain.py TRACE.json [schedule] [heads per KV head]"""
import collections
import json
import sys


def tile_vars(tile: str) -> dict[str, int]:
    return {k: int(v) for k, v in (p.split("=") for p in tile.split())}


def main(path: str, schedule: str = "fused-push", g_heads: int = 8) -> None:
    d = json.load(open(path))
    ev = d["traceEvents"] if isinstance(d, dict) else d
    names = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name"}
    groups = collections.defaultdict(lambda: collections.defaultdict(list))
    for e in ev:
        st = e.get("args", {}).get("stage")
        if e["ph"] != "X" or schedule not in names[e["pid"]] or st not in ("split", "local", "combine"):
            continue
        v = tile_vars(e["args"]["tile"])
        g = v["g"] if "g" in v else v["h"] // g_heads
        groups[(v.get("b", 0), g)][st].append((e["ts"], e["ts"] + e["dur"]))
    for (b, g), s in sorted(groups.items()):
        last = max(end for _, end in s["split"])
        first = min(end for _, end in s["split"])
        loc = s["local"]
        print(f"b{b} g{g:2d}: splits end {first:6.2f} .. {last:6.2f} us; after the last: local starts "
              f"{min(t for t, _ in loc) - last:+.2f} .. {max(t for t, _ in loc) - last:+.2f}, ends by "
              f"{max(t for _, t in loc) - last:+.2f}; combine ends by {max(t for _, t in s['combine']) - last:+.2f}")


if __name__ == "__main__":
    main(sys.argv[1], *(sys.argv[2:3]), *(int(x) for x in sys.argv[3:4]))
