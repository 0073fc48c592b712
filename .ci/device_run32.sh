# device call 32 (session 6): final decode-paper with programmatic dependent launch and the cold-L2 kernel timer;
# the gpu_time tests first (their hot reference fixed after call 31).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 60 python3 -m pytest -m gpu -q -rf tests/gpu/test_gpu_time.py > $OUT/gpu_tests16.txt 2>&1; tail -3 $OUT/gpu_tests16.txt
timeout 400 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-paper --schedules bsp,fused-push --iters 15 --no-tune > $OUT/bench_decode.txt 2>&1; tail -74 $OUT/bench_decode.txt | cut -c1-150
for f in json png; do cp benchmarks/results/h200-1gpu/flash_decode_decode-paper_bf16.$f $OUT/decode_paper.$f; done
