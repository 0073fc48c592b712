python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 290 python3 benchmarks/runs/ragged/ragged_probe.py > $OUT/ragged_probe.log 2>&1; tail -30 $OUT/ragged_probe.log
timeout 270 python3 -m tilec bench examples/flash_decode.tile --world 1 --shapes decode-paper --schedules fused-push --iters 10 --out $OUT/fd_paper > $OUT/fd_paper.log 2>&1
grep -E "^\[" $OUT/fd_paper.log | cut -c1-150
