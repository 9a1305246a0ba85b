#!/usr/bin/env bash
# Stops the training on every worker of the TPU VM: SIGTERM to the sweep loops (so no next run
# starts), then to the trainers (each saves a checkpoint and exits; re-running the same
# run.sh / sweep.sh command resumes). Does not touch data.sh's builds.
#
#   TPU_NAME=relu-vit PROJECT=my-project ZONE=europe-west4-a bash launch/tpu/stop.sh [--dry-run]
#
# Runs: gcloud compute tpus tpu-vm ssh $TPU_NAME ... --worker=all --command=<kill -TERM the
#   processes `pgrep -f` finds: `bash ~/sweeps/*.sh` and `python -m big_vision_relu.train`>
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
((${#POSITIONAL[@]} == 0)) || usage_error "unexpected argument '${POSITIONAL[0]}'"
require TPU_NAME PROJECT ZONE
need_gcloud

remote_command="for p in \"${SWEEP_PATTERN}\" \"${TRAIN_PATTERN}\"; do"' for pid in $(pgrep -f "$p"); do echo "$(hostname): SIGTERM $(ps -o args= -p "$pid")"; kill -TERM "$pid" || true; done; done; echo "$(hostname): stopped"'
tpu_ssh all "${remote_command}"
