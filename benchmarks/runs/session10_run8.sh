python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
for n in 2 3; do
  DECODE_SWEEP=64k TILEC_PROGRAMS_PER_SM=$n timeout 140 python3 benchmarks/runs/decode_cfg_probe.py examples/flash_decode.tile > $OUT/decode_per_sm$n.log 2>&1
  echo "== $n programs per SM"; tail -6 $OUT/decode_per_sm$n.log
done
