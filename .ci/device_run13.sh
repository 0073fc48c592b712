# device call 13 (session 3): the host launch path with a reused launch plan, then the decode-paper and GEMM
# benches on the final code (head-major KV, remote stores by peer offset, launch plans).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 60 python3 benchmarks/launch_probe.py > $OUT/launch_probe.txt 2>&1; grep "host launch" $OUT/launch_probe.txt
timeout 320 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-paper --schedules bsp,fused-push --iters 15 --no-tune > $OUT/bench_decode.txt 2>&1; tail -45 $OUT/bench_decode.txt
for f in json png; do cp benchmarks/results/h200-1gpu/flash_decode_decode-paper_bf16.$f $OUT/decode_paper.$f; done
timeout 180 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper,square --iters 15 --no-tune > $OUT/bench_ag.txt 2>&1; tail -32 $OUT/bench_ag.txt
for f in json png; do cp "benchmarks/results/h200-1gpu/ag_gemm_paper+square_bf16.$f" $OUT/ag_paper.$f; done
