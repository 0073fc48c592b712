python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
timeout 300 python3 benchmarks/runs/ragged/small_probe.py > $OUT/small_probe.log 2>&1; tail -22 $OUT/small_probe.log
SMALL_SWEEP=one TILEC_PDL=0 timeout 120 python3 benchmarks/runs/ragged/small_probe.py > $OUT/small_probe_nopdl.log 2>&1; tail -4 $OUT/small_probe_nopdl.log
