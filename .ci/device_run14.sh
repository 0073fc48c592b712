# device call 14 (session 3): launch plans pass pointers as ints (no data_ptr() + cuPointerGetAttribute per pointer
# per launch). Host path, GPU tests of the launch path, decode-quick and the GEMM rows on it.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TILEC_CACHE=/tmp/tilec-cache
timeout 60 python3 benchmarks/launch_probe.py > $OUT/launch_probe2.txt 2>&1; grep "host launch" $OUT/launch_probe2.txt
timeout 200 python3 -m pytest -m gpu -q -rf tests/gpu -k "many_calls or (flash and bf16-2) or (ag_gemm_all and 2) or (reductions and 2)" > $OUT/gpu_tests5.txt 2>&1; tail -4 $OUT/gpu_tests5.txt
timeout 120 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-quick --schedules bsp,fused-push --iters 20 --no-tune > $OUT/bench_decode_quick.txt 2>&1; tail -14 $OUT/bench_decode_quick.txt
for f in json png; do cp benchmarks/results/h200-1gpu/flash_decode_decode-quick_bf16.$f $OUT/decode_quick.$f; done
timeout 90 python3 -m tilec bench examples/ag_gemm.tile --world 1 --shapes paper,square --schedules fused-pull,fused-push --iters 15 --no-tune > $OUT/bench_ag2.txt 2>&1; tail -19 $OUT/bench_ag2.txt
