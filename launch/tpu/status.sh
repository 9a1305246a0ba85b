#!/usr/bin/env bash
# Shows the TPU VM's state and what worker 0 is doing (newest logs, running trainers); with
# --data, the data VM's (data.sh's) instead: each dataset's newest line in ~/logs/data.log
# (started, progress: examples done, rate, ETA; ready or FAILED).
#
#   TPU_NAME=relu-vit PROJECT=my-project ZONE=europe-west4-a bash launch/tpu/status.sh [--lines=N] [--dry-run]
#   PROJECT=my-project ZONE=europe-west4-a bash launch/tpu/status.sh --data [--dry-run]
#
# --data runs: gcloud compute instances describe $DATA_VM ... --format=value(status)
#              gcloud compute ssh $DATA_VM ... --command=<the newest line per dataset>
#
# Runs: (QUEUED=1: gcloud compute tpus queued-resources describe $TPU_NAME ...)
#       gcloud compute tpus tpu-vm list --zone=$ZONE --project=$PROJECT
#       gcloud compute tpus tpu-vm describe $TPU_NAME --zone=$ZONE --project=$PROJECT --format=...
#       gcloud compute tpus tpu-vm ssh $TPU_NAME ... --worker=0 --command=<last N (default 5)
#         lines of the 3 newest logs in ~/logs, and the training processes running>
# Every step runs even if an earlier one fails (e.g. no VM yet); the exit code is 1 if any did.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OPTIONS=(--lines= --data)
OPT_lines=5
OPT_data=0
parse_args "$@"
((${#POSITIONAL[@]} == 0)) || usage_error "unexpected argument '${POSITIONAL[0]}'"
[[ ${OPT_lines} =~ ^[0-9]+$ ]] || usage_error "--lines needs a number, not '${OPT_lines}'"

if [[ ${OPT_data} == 1 ]]; then
  require PROJECT ZONE
  DATA_VM="${DATA_VM:-relu-vit-data}"
  validate_var DATA_VM
  need_gcloud
  run_cmd gcloud compute instances describe "${DATA_VM}" "--zone=${ZONE}" "--project=${PROJECT}" \
    '--format=value(status)' || die "no data VM ${DATA_VM} (data.sh deletes it when it ends)"
  # The newest line of each dataset (keyed by its name, as its log file names it), in the
  # order they started, then data.sh's own last line if it ended.
  vm_ssh "if [ ! -f ~/logs/data.log ]; then echo \"\$(hostname): no ~/logs/data.log yet\"; exit 1; fi; awk '\$1 == \"==\" { k = \$3; gsub(/[\\/:]/, \"_\", k); if (!(k in last)) order[n++] = k; last[k] = \$0 } END { for (i = 0; i < n; i++) print last[order[i]] }' ~/logs/data.log"
  exit
fi

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
