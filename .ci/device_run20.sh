# device call 20 (session 4): decode-paper with the wave-count default split (default_bs: one wave of 256 tasks of
# 2048 keys at 32K with 128 heads, where bsp's local phase measured fastest in call 19's probe).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 330 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-paper --schedules bsp,fused-push --iters 15 --no-tune > $OUT/bench_decode.txt 2>&1; tail -55 $OUT/bench_decode.txt | cut -c1-150
for f in json png; do cp benchmarks/results/h200-1gpu/flash_decode_decode-paper_bf16.$f $OUT/decode_paper.$f; done
timeout 60 python3 -m tilec taxes examples/flash_decode.tile --world 1 -D B=1 -D HKV=16 -D G=8 -D D=128 -D S=32768 -D BS=2048 --measure --timeline > $OUT/taxes_decode_32K_bs2048.txt 2>&1; grep -A6 "^fused-push: call" $OUT/taxes_decode_32K_bs2048.txt
