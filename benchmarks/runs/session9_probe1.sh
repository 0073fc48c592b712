python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
D="-D B=1 -D HKV=16 -D G=8 -D D=128 -D S=8192 -D BS=512"
TILEC_FOLD=0 timeout 200 python3 -m tilec taxes examples/flash_decode.tile --world 1 $D --measure --timeline --trace $OUT/fd8k_nofold.json > $OUT/fd8k_nofold.log 2>&1
timeout 200 python3 -m tilec taxes examples/flash_decode.tile --world 1 $D --measure --timeline --trace $OUT/fd8k_fold.json > $OUT/fd8k_fold.log 2>&1
timeout 300 python3 benchmarks/runs/gemm_floor_probe.py 1024 3584 8192 > $OUT/gemm_probe.log 2>&1
tail -5 $OUT/*.log
