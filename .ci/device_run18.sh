# device call 18 (session 4): decode-paper on the final code (block flag waits, covered waits dropped), with a copy
# of K timed in the same run and bsp's local phase alone; then All-Gather + GEMM's flag schedules (their waits
# changed too) beside torch.matmul.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 400 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-paper --schedules bsp,fused-push --iters 15 --no-tune > $OUT/bench_decode.txt 2>&1; tail -40 $OUT/bench_decode.txt
for f in json png; do cp benchmarks/results/h200-1gpu/flash_decode_decode-paper_bf16.$f $OUT/decode_paper.$f; done
timeout 150 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper,square --schedules fused-pull,fused-push,specialized --iters 15 --no-tune > $OUT/bench_ag.txt 2>&1; tail -22 $OUT/bench_ag.txt
