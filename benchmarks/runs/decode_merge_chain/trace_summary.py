"""Summarise a `tilec taxes --trace` file of one flash-decode call: per stage, when its first task started and its
last ended (us from the call's first start), and for the split stage the spread of its tasks' ends.
Usage: python benchmarks/runs/decode_merge_chain/trace_summary.py TRACE.json [schedule]"""
import json
import statistics
import sys

trace = json.load(open(sys.argv[1]))
want = sys.argv[2] if len(sys.argv) > 2 else "fused-push"
procs = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
xs = [e for e in trace["traceEvents"] if e["ph"] == "X" and want in procs.get(e["pid"], "")]
if not xs:
    sys.exit(f"no slices of {want}: processes {sorted(set(procs.values()))}")
t0 = min(e["ts"] for e in xs)
by = {}
for e in xs:
    by.setdefault(e["args"].get("stage", e["name"]), []).append(e)
for st, es in sorted(by.items(), key=lambda kv: min(e["ts"] for e in kv[1])):
    starts = [e["ts"] - t0 for e in es]
    ends = [e["ts"] + e["dur"] - t0 for e in es]
    durs = [e["dur"] for e in es]
    print(f"{st:10s} {len(es):4d} tasks: first start {min(starts):6.2f}  last start {max(starts):6.2f}  "
          f"ends p10 {statistics.quantiles(ends, n=10)[0] if len(ends) > 1 else ends[0]:6.2f} "
          f"median {statistics.median(ends):6.2f} last {max(ends):6.2f}  work median {statistics.median(durs):.2f} us")
