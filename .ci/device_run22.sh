# device call 22 (session 4): after review fixes (captured variants fitted apart from the ordinary ones, exit
# barrier on replays, bench extras in their own try): the capture GPU tests (flash decode world 1/2 with two graphs
# and the epoch/counter invariant, All-Gather + GEMM fused-pull / fused-push at world 2), ag_gemm world 2, reuse.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 280 python3 -m pytest -m gpu -q -rf tests/gpu -k "captured or (ag_gemm_all and 2) or (many_calls and fused-pull)" > $OUT/gpu_tests9.txt 2>&1; tail -25 $OUT/gpu_tests9.txt
