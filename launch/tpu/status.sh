#!/usr/bin/env bash
# Shows the TPU VM's state and what worker 0 is doing (newest logs, running trainers).
#
#   TPU_NAME=relu-vit PROJECT=my-project ZONE=europe-west4-a bash launch/tpu/status.sh [--lines=N] [--dry-run]
#
# Runs: (QUEUED=1: gcloud compute tpus queued-resources describe $TPU_NAME ...)
#       gcloud compute tpus tpu-vm list --zone=$ZONE --project=$PROJECT
#       gcloud compute tpus tpu-vm describe $TPU_NAME --zone=$ZONE --project=$PROJECT --format=...
#       gcloud compute tpus tpu-vm ssh $TPU_NAME ... --worker=0 --command=<last N (default 5)
#         lines of the 3 newest logs in ~/logs, and the training processes running>
# Every step runs even if an earlier one fails (e.g. no VM yet); the exit code is 1 if any did.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OPTIONS=(--lines=)
OPT_lines=5
parse_args "$@"
((${#POSITIONAL[@]} == 0)) || usage_error "unexpected argument '${POSITIONAL[0]}'"
[[ ${OPT_lines} =~ ^[0-9]+$ ]] || usage_error "--lines needs a number, not '${OPT_lines}'"
require TPU_NAME PROJECT ZONE
need_gcloud

status=0
if [[ ${QUEUED} == 1 ]]; then
  run_cmd gcloud compute tpus queued-resources describe "${TPU_NAME}" "--zone=${ZONE}" \
    "--project=${PROJECT}" || status=1
fi
run_cmd gcloud compute tpus tpu-vm list "--zone=${ZONE}" "--project=${PROJECT}" || status=1
run_cmd gcloud compute tpus tpu-vm describe "${TPU_NAME}" "--zone=${ZONE}" "--project=${PROJECT}" \
  '--format=yaml(state,health,healthDescription,acceleratorType,runtimeVersion,schedulingConfig)' ||
  status=1
remote_command="cd ~/logs 2> /dev/null && for f in \$(ls -t *.log 2> /dev/null | head -n 3); do echo \"==> ~/logs/\$f <==\"; tail -n ${OPT_lines} \"\$f\"; done; echo \"== training processes on \$(hostname):\"; pgrep -af \"${TRAIN_PATTERN}|${SWEEP_PATTERN}\" || echo none"
tpu_ssh 0 "${remote_command}" || status=1
exit "${status}"
