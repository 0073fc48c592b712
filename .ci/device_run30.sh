# device call 30 (session 6): the decode bench's kernel_time on a clean L2 flush (tilec.perf.gpu_time.cold_time):
# gpu_time tests + flash decode GPU tests, then decode-paper (bsp, fused-push, graph rows, SDPA).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 120 python3 -m pytest -m gpu -q -rf tests/gpu -k "gpu_time or (flash_decode_on_gpu and bf16-1) or (captured and flash)" > $OUT/gpu_tests14.txt 2>&1; tail -4 $OUT/gpu_tests14.txt
timeout 420 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-paper --schedules bsp,fused-push --iters 15 --no-tune > $OUT/bench_decode.txt 2>&1; tail -74 $OUT/bench_decode.txt | cut -c1-150
for f in json png; do cp benchmarks/results/h200-1gpu/flash_decode_decode-paper_bf16.$f $OUT/decode_paper.$f; done
