# device call 19 (session 4): decode-paper with bsp's local phase timed as a kernel time (do_bench, like the copy
# of K beside it), then the local phase alone per launch configuration at 32K / 64K.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 330 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-paper --schedules bsp,fused-push --iters 15 --no-tune > $OUT/bench_decode.txt 2>&1; tail -58 $OUT/bench_decode.txt | cut -c1-150
for f in json png; do cp benchmarks/results/h200-1gpu/flash_decode_decode-paper_bf16.$f $OUT/decode_paper.$f; done
timeout 230 python3 benchmarks/decode_local_probe.py > $OUT/decode_local_probe.txt 2>&1; cat $OUT/decode_local_probe.txt | tail -30
