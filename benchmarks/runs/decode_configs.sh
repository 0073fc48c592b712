#!/bin/sh
# Flash decode's launch configurations and load forms, one H200, world 1, bf16: split size x attend block x warps x
# stages, heads per tail task, programs per SM, and the split stage alone by load form. Results:
# benchmarks/results/h200-1gpu/decode_configs/. Run from the repository root: sh benchmarks/runs/decode_configs.sh PART
#   sweep    split size x attend block x warps x stages vs SDPA at the quick shapes (decode_configs/decode_cfg_sweep.py)
#   cfg      split x heads per tail task x attend block of one program (decode_cfg_probe.py; default: the example)
#   per-sm   64K keys at 2 and 3 programs per SM (decode_cfg_probe.py --programs-per-sm)
#   stream   the split stage alone, by load form (decode_stream_probe.py)
set -e
out=${OUT:-benchmarks/results/h200-1gpu/decode_configs}
mkdir -p "$out"
p=benchmarks/runs/decode_configs
case "$1" in
  sweep) python $p/decode_cfg_sweep.py quick > "$out/decode_cfg_sweep.log" 2>&1 ;;
  cfg) python $p/decode_cfg_probe.py "${2:-examples/flash_decode.tile}" > "$out/decode_cfg_probe.log" 2>&1 ;;
  per-sm)
    for n in 2 3; do
      DECODE_SWEEP=64k python $p/decode_cfg_probe.py examples/flash_decode.tile --programs-per-sm $n \
        > "$out/decode_per_sm$n.log" 2>&1
    done ;;
  stream) python $p/decode_stream_probe.py > "$out/decode_stream_probe.log" 2>&1 ;;
  *) echo "usage: $0 sweep|cfg [PROGRAM]|per-sm|stream" >&2; exit 2 ;;
esac
