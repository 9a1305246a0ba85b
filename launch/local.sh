#!/usr/bin/env bash
# The main job: train a ViT with relu/L attention on the offline mnist5k dataset, then evaluate.
#
#   bash launch/local.sh                                   # configs/local/mnist_relu.py
#   bash launch/local.sh configs/local/mnist_relu.py:attention=softmax workdirs/softmax
#   bash launch/local.sh CONFIG[:ARGS] [WORKDIR] [--config.key=value ...]
#
# On a fresh machine it creates .venv/ (Python >= 3.11), installs this package, builds the
# offline datasets (no network), trains, and prints where the results and TensorBoard logs are.
# Re-running the same command resumes the run from its last checkpoint.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG="${1:-configs/local/mnist_relu.py}"
name="$(basename "${CONFIG%%:*}" .py)"
WORKDIR="${2:-workdirs/${name}}"
shift $(( $# < 2 ? $# : 2 ))

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e .

.venv/bin/python -m big_vision_relu.data.prepare
.venv/bin/python -m big_vision_relu.train --config "$CONFIG" --workdir "$WORKDIR" "$@"

echo
echo "Results:     $WORKDIR/metrics.jsonl (one JSON line per logged step), $WORKDIR/config.json"
echo "Checkpoints: $WORKDIR/checkpoints/"
echo "TensorBoard: .venv/bin/tensorboard --logdir $WORKDIR"
