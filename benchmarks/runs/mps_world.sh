#!/bin/sh
# W ranks on one GPU running side by side under CUDA MPS, each on its share of the SMs.
#
#   sh benchmarks/runs/mps_world.sh W CMD ARGS...          # torchrun --standalone --nproc-per-node W --no-python CMD..
#   sh benchmarks/runs/mps_world.sh --spawn W CMD ARGS...  # CMD once; it starts the W ranks itself (tilec.runtime.spawn:
#                                                          # `tilec taxes`, the GPU tests with --world W)
# e.g. sh benchmarks/runs/mps_world.sh 2 python -m tilec bench examples/ag_gemm.tile --shapes paper --no-tune
#      sh benchmarks/runs/mps_world.sh --spawn 2 python -m pytest -m gpu tests/gpu --world 2
#
# Starts the MPS control daemon (pipe and log folders of its own), gives every client
# CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100/W (multi_processor_count then reports that share, and tilec sizes its
# persistent grids from it), runs every rank on the first visible GPU, and stops the daemon when CMD ends, fails or
# is interrupted. Exit status: CMD's; 2 where MPS is unavailable (no control binary, or the daemon does not start).
# Ranks share one GPU: links between them are HBM, not NVLink; times measure barriers, launches, waits and overlap.
set -u
spawn=0
if [ "${1:-}" = "--spawn" ]; then spawn=1; shift; fi
W=${1:-}
case "$W" in ''|*[!0-9]*) echo "usage: mps_world.sh [--spawn] W CMD ARGS... (W: ranks, 1-16)" >&2; exit 2;; esac
shift
if [ "$W" -lt 1 ] || [ "$W" -gt 16 ] || [ $# -eq 0 ]; then
  echo "usage: mps_world.sh [--spawn] W CMD ARGS... (W: ranks, 1-16)" >&2; exit 2
fi
fail() { echo "mps_world.sh: $*" >&2; exit 2; }
command -v nvidia-cuda-mps-control >/dev/null 2>&1 ||
  fail "MPS is unavailable here: nvidia-cuda-mps-control is not on PATH (it ships with the CUDA driver tools)"
command -v nvidia-smi >/dev/null 2>&1 && ! nvidia-smi -L >/dev/null 2>&1 && fail "no GPU answers nvidia-smi -L"
dir=${TMPDIR:-/tmp}/tilec-mps-$$
export CUDA_MPS_PIPE_DIRECTORY="$dir/pipe" CUDA_MPS_LOG_DIRECTORY="$dir/log"
mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY" || fail "cannot create $dir"
nvidia-cuda-mps-control -d || fail "the MPS control daemon did not start (log: $CUDA_MPS_LOG_DIRECTORY/control.log;
  MPS needs a GPU in Default or Exclusive-process compute mode and the right to start the daemon)"
stop() {
  rc=$?
  echo quit | nvidia-cuda-mps-control >/dev/null 2>&1
  i=0
  while [ -e "$CUDA_MPS_PIPE_DIRECTORY/control" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  rm -rf "$dir"
  exit $rc
}
trap 'stop' EXIT
export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$((100 / W))
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES%%,*}"  # every rank on one GPU (cuda:0)
# the daemon answers, and a client of it sees its share
python3 -c "import torch; p = torch.cuda.get_device_properties(0); print(f'mps_world.sh: world $W on {p.name}, \
{p.multi_processor_count} SMs per rank (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)')" ||
  fail "a CUDA client could not start under MPS (log: $CUDA_MPS_LOG_DIRECTORY)"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# CMD in the background, so that a SIGTERM (timeout, a job scheduler) reaches it at once, not after it ends
if [ $spawn = 1 ]; then
  "$@" &
else
  torchrun --standalone --nproc-per-node "$W" --no-python "$@" &
fi
child=$!
trap 'kill -TERM $child 2>/dev/null; wait $child; exit 143' TERM HUP
trap 'kill -INT $child 2>/dev/null; wait $child; exit 130' INT
wait $child
