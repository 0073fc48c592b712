python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit
sh benchmarks/runs/fd_8k_timeline.sh $OUT/fd_8k_timeline
