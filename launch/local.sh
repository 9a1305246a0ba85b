#!/usr/bin/env bash
# The main job: train a ViT with relu/L attention on the offline mnist5k dataset, then evaluate.
#
#   bash launch/local.sh [CONFIG[:ARGS]] [WORKDIR] [--config.key=value ...] [--allow_config_change]
#
#   bash launch/local.sh                                         # workdirs/mnist_relu
#   bash launch/local.sh configs/local/mnist_relu.py:attention=softmax
#                                                 # workdirs/mnist_relu-attention=softmax
#   bash launch/local.sh configs/local/mnist_relu.py --config.lr=1e-3
#                                                 # workdirs/mnist_relu-lr=1e-3
#   bash launch/local.sh configs/local/mnist_relu.py workdirs/mnist_relu \
#       --config.total_epochs=60 --allow_config_change      # the first run, 30 more epochs
#
# Arguments are read by what they are, in any order: one starting with -- is a flag for the
# trainer (write it --key=value, not --key value), the first other one is CONFIG (default
# configs/local/mnist_relu.py), the second WORKDIR. Without WORKDIR the run goes to
# workdirs/NAME: the config's file name, then its ARGS and each --config override, joined by
# "-" (characters other than letters, digits and ._,=+- become _), so two different configs
# never share a workdir by accident.
# Re-running the same command resumes the run from its last checkpoint. The trainer refuses a
# workdir whose config.json differs from the new config (naming the keys) before writing
# anything; --allow_config_change continues it deliberately (e.g. more epochs), and the
# workdir's config_history.jsonl keeps every config it was run with.
# --dry-run prints the commands instead of running them; --help prints this.
#
# On a fresh machine it creates .venv/ (Python >= 3.11), installs this package, builds the
# offline datasets (no network), trains, and prints where the results and TensorBoard logs are.
set -euo pipefail
cd "$(dirname "$0")/.."

# usage, usage_error: the header comment above as the usage.
# shellcheck source-path=SCRIPTDIR source=usage.sh
source "$(dirname "$0")/usage.sh"

run() {  # run COMMAND...: runs it, or prints it (shell-quoted) with --dry-run
  if [[ -n ${DRY_RUN} ]]; then
    printf '%q ' "$@"
    printf '\n'
  else
    "$@"
  fi
}

DRY_RUN=""
POSITIONAL=()
FLAGS=()
for arg in "$@"; do
  case "${arg}" in
    -h|--help) usage; exit 0 ;;
    --dry-run) DRY_RUN=1 ;;
    --?*) FLAGS+=("${arg}") ;;
    -*) usage_error "unknown option '${arg}': the trainer's flags start with -- (--key=value)" ;;
    *) POSITIONAL+=("${arg}") ;;
  esac
done
if (( ${#POSITIONAL[@]} > 2 )); then
  usage_error "too many arguments (${POSITIONAL[*]}): CONFIG and WORKDIR at most; give flags" \
              "as --key=value, not --key value"
fi
CONFIG="${POSITIONAL[0]:-configs/local/mnist_relu.py}"
if [[ ! -f ${CONFIG%%:*} ]]; then
  usage_error "config file '${CONFIG%%:*}' not found (flags are --key=value, not --key value)"
fi

if (( ${#POSITIONAL[@]} == 2 )); then
  WORKDIR="${POSITIONAL[1]}"
else
  name="$(basename "${CONFIG%%:*}" .py)"
  if [[ ${CONFIG} == *:?* ]]; then
    name+="-${CONFIG#*:}"
  fi
  for flag in "${FLAGS[@]}"; do
    if [[ ${flag} == --config.* ]]; then
      name+="-${flag#--config.}"
    fi
  done
  name="${name//[^A-Za-z0-9._,=+-]/_}"
  if (( ${#name} > 200 )); then  # a file name has at most 255 bytes: keep it unique with a sum
    name="${name:0:180}-$(printf '%s' "${name}" | cksum | cut -d' ' -f1)"
  fi
  WORKDIR="workdirs/${name}"
fi

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  run "$PYTHON" -m venv .venv
fi
run .venv/bin/python -m pip install --quiet --upgrade pip
run .venv/bin/python -m pip install --quiet -e .

run .venv/bin/python -m big_vision_relu.data.prepare
run .venv/bin/python -m big_vision_relu.train --config "$CONFIG" --workdir "$WORKDIR" "${FLAGS[@]}"

echo
echo "Results:     $WORKDIR/metrics.jsonl (one JSON line per logged step), $WORKDIR/config.json"
echo "Checkpoints: $WORKDIR/checkpoints/"
echo "TensorBoard: .venv/bin/tensorboard --logdir $WORKDIR"
