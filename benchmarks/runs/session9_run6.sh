python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 150 python3 -m tilec calibrate -o $OUT/machine.json > $OUT/calibrate.log 2>&1; tail -8 $OUT/calibrate.log
export TILEC_MACHINE=$OUT/machine.json TILEC_CACHE=$(mktemp -d)
timeout 400 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper --iters 10 --no-tune \
  --schedules auto,flags,flags+dma,fused-push,fused-push+dma,fused-pull --out $OUT/auto_w1 > $OUT/auto_w1.log 2>&1
python3 benchmarks/runs/auto_vs_best.py $OUT/auto_w1/*.json > $OUT/auto_vs_best_w1.log 2>&1; cat $OUT/auto_vs_best_w1.log
