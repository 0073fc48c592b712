python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
export TILEC_CACHE=$(mktemp -d)  # tune afresh
timeout 520 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper --schedules fused-pull --iters 20 --out $OUT/pull_tuned > $OUT/ag_gemm_pull_tuned.log 2>&1
grep -A12 "^shape" $OUT/ag_gemm_pull_tuned.log | head -14
