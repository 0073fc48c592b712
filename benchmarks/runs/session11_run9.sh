python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 120 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes small --iters 10 --out $OUT/gemm_small > $OUT/gemm_small.log 2>&1
grep -E "second round|^\[" $OUT/gemm_small.log | cut -c1-220 | tail -12
timeout 330 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper --schedules fused-pull,fused-push --iters 20 --out $OUT/ag_gemm_paper > $OUT/ag_gemm_paper.log 2>&1
grep -E "second round|^\[" $OUT/ag_gemm_paper.log | cut -c1-240
