#!/usr/bin/env bash
# Issue 86's measurements on a GPU, in one command of at most 9 minutes (about 6-7 on an H200):
#
#   bash benchmarks/gpu_check.sh [LOG_DIR]
#
# from the repository root of a GPU machine whose python3 has jax with CUDA, flax, optax, scipy
# and pytest (no TensorFlow needed). Logs go to LOG_DIR (default: $OUT if set, else
# results/benchmarks/<gpu>-<date>/), one file per step, each step under its own time limit so
# that one that hangs cannot take the others' time. In order of what the issue needs first:
#   tests.log      the compiled Triton kernels (and attention_impl='cudnn') == float64 / dense
#                  (tests marked `gpu` in tests/test_pallas_attention.py)
#   op.log         forward alone and forward + backward, L = 197, 785, 4096, 16384: pallas
#                  relu/L vs cuDNN's softmax (padded to even lengths) and XLA, TFLOP/s
#   train_s8.log   the S/8 training step (L = 785) vs the best softmax step (dense, cudnn)
#   errors.log     bf16 errors vs float32 at L = 197 and 4096 (relu, gelu)
#   train_s16.log  the S/16 training step (L = 197), if time is left
set -uo pipefail
cd "$(dirname "$0")/.." || exit
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | awk '{print tolower($NF)}')
dir=${1:-${OUT:-results/benchmarks/${gpu}-$(date +%F)}}
mkdir -p "$dir"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: the command's output, also into NAME.log
  local name=$1 limit=$2
  shift 2
  echo "== $name (at most ${limit}s): $*"
  timeout "$limit" "$@" 2>&1 | tee "$dir/$name.log"
  echo "== $name: exit ${PIPESTATUS[0]}"
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c "import sys, jax, flax, optax; print(sys.version); print('jax', jax.__version__, \
'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
  git log -1 --format='commit %H %cd'
} 2>&1 | tee "$dir/env.log"
step tests 150 env JAX_PLATFORMS=cuda python3 -m pytest -q -p no:cacheprovider -m gpu \
  tests/test_pallas_attention.py
step op 130 python3 benchmarks/pallas_attention.py --tables op
step train_s8 150 python3 benchmarks/pallas_attention.py --tables train --train_models S/8:224 \
  --rounds 6
step errors 60 python3 benchmarks/pallas_attention.py --tables errors --lengths 197,4096 \
  --error_activations relu,gelu
step train_s16 60 python3 benchmarks/pallas_attention.py --tables train \
  --train_models S/16:224 --rounds 6
