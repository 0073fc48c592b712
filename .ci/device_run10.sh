# device call 10 (NOT RUN YET: device time ran out in the session that wrote it). Run it first next session.
# The final code: NPROG compiled in, recompiled when 2 programs/SM fit. Re-times GEMM and decode rows, and
# probes noinline task functions (offline: the merged flash-decode kernel drops from 255 to 128 registers).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 60 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper,square --schedules fused-pull --iters 20 --no-tune > $OUT/ag_final.log 2>&1; tail -13 $OUT/ag_final.log; grep -o "programs_per_sm': [0-9]" $OUT/ag_final.log | sort | uniq -c
timeout 150 python3 benchmarks/decode_probe.py > $OUT/decode_probe2.log 2>&1; tail -12 $OUT/decode_probe2.log
timeout 90 python3 -m tilec taxes examples/ag_gemm.tile --world 1 -D M=8192 -D N=8192 -D K=8192 -D BM=128 -D BN=256 -D BK=64 --num-warps 8 --measure --timeline > $OUT/taxes_timeline.log 2>&1; tail -12 $OUT/taxes_timeline.log
