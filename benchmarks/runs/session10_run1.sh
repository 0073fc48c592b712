python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
A="--world 1 --shapes decode-quick --schedules fused-push --iters 20"
timeout 170 python3 -m tilec bench examples/flash_decode.tile $A --out $OUT/fd_fold > $OUT/fd_fold.log 2>&1
timeout 170 python3 -m tilec bench benchmarks/runs/tail/flash_decode_g.tile $A --out $OUT/fd_g > $OUT/fd_g.log 2>&1
TILEC_FOLD=0 timeout 170 python3 -m tilec bench benchmarks/runs/tail/flash_decode_g.tile $A --out $OUT/fd_g_nofold > $OUT/fd_g_nofold.log 2>&1
for f in fd_fold fd_g fd_g_nofold; do echo "== $f"; grep -B2 -A8 "^shape" $OUT/$f.log | head -16; tail -3 $OUT/$f.log; done
