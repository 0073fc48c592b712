# device call 16 (session 4): the flag-scope change (GPU-scope counters for rank-local hops) on a GPU for the
# first time: stage spans of the persistent flash decode at 32K / 128K (the ~22 us tail), then the GPU tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
for sb in "32768 1024" "131072 4096"; do set -- $sb
  timeout 80 python3 -m tilec taxes examples/flash_decode.tile --world 1 -D B=1 -D HKV=16 -D G=8 -D D=128 -D S=$1 -D BS=$2 --measure --timeline > $OUT/taxes_decode_scope_$1.txt 2>&1; grep -B3 -A6 "^fused-push: call" $OUT/taxes_decode_scope_$1.txt
done
timeout 60 python3 benchmarks/launch_probe.py > $OUT/launch_probe3.txt 2>&1; grep "host launch" $OUT/launch_probe3.txt
timeout 330 python3 -m pytest -m gpu -q -rf tests/gpu -k "many_calls or (flash and (bf16-1 or bf16-2 or f16-4)) or (ag_gemm_all and 2) or (reductions and 2)" > $OUT/gpu_tests6.txt 2>&1; tail -4 $OUT/gpu_tests6.txt
