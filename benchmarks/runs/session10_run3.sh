python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
P=benchmarks/runs/tail/flash_decode_g.tile
A="--world 1 --shapes decode-quick --schedules fused-push --iters 20"
timeout 150 python3 -m tilec bench $P $A --out $OUT/fd_g2 > $OUT/fd_g2.log 2>&1
TILEC_FOLD=0 timeout 150 python3 -m tilec bench $P $A --out $OUT/fd_g2_nofold > $OUT/fd_g2_nofold.log 2>&1
for f in fd_g2 fd_g2_nofold; do echo "== $f"; grep -E "fused-push  |torch sdpa  " $OUT/$f.log | grep -v "GB/s" | cut -c1-90; done
timeout 100 python3 -m tilec taxes $P --world 1 -D B=1 -D HKV=16 -D G=8 -D D=128 -D S=8192 -D BS=512 --measure --timeline > $OUT/fdg2_8k_timeline.log 2>&1
grep -A6 "^fused-push: call" $OUT/fdg2_8k_timeline.log
timeout 100 python3 -m tilec taxes $P --world 1 -D B=1 -D HKV=12 -D G=8 -D D=128 -D S=65536 -D BS=4096 --measure --timeline > $OUT/fdg2_64k_timeline.log 2>&1
grep -A6 "^fused-push: call" $OUT/fdg2_64k_timeline.log
TILEC_FOLD=0 timeout 100 python3 -m tilec taxes $P --world 1 -D B=1 -D HKV=12 -D G=8 -D D=128 -D S=65536 -D BS=4096 --measure --timeline > $OUT/fdg2_64k_nofold_timeline.log 2>&1
grep -A6 "^fused-push: call" $OUT/fdg2_64k_nofold_timeline.log
