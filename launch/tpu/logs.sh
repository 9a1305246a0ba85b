#!/usr/bin/env bash
# Follows a log on one worker (tail -F, until Ctrl-C): a run's or a sweep's (data.sh follows
# its own builds' log on its CPU VM); once the TPU VM is gone (preempted, deleted), prints the
# copy in the bucket instead.
#
#   TPU_NAME=relu-vit PROJECT=my-project ZONE=europe-west4-a BUCKET=my-bucket \
#     bash launch/tpu/logs.sh [RUN_NAME] [--worker=N] [--lines=N] [--bucket] [--dry-run]
#
# RUN_NAME: the run.sh RUN_NAME or the sweep name (e.g. fig1); the log is
# ~/logs/RUN_NAME.log on worker N (default 0: process 0 logs the metrics). Without RUN_NAME:
# the newest log there. Runs: gcloud compute tpus tpu-vm describe $TPU_NAME ... (is it there?)
#   then gcloud compute tpus tpu-vm ssh $TPU_NAME --zone=$ZONE --project=$PROJECT --worker=N
#   --command='tail -n LINES -F ~/logs/RUN_NAME.log'
# If the VM is not there, or with --bucket: the last LINES lines of the copy run.sh and
# sweep.sh keep (every LOG_SYNC_SECONDS) in gs://$BUCKET/logs/$TPU_NAME/workerN/RUN_NAME.log
# (gcloud storage cat; without RUN_NAME, gcloud storage ls of that folder). BUCKET is needed
# for that only.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OPTIONS=(--worker= --lines= --bucket)
OPT_worker=0
OPT_lines=50
OPT_bucket=0
parse_args "$@"
((${#POSITIONAL[@]} <= 1)) || usage_error "expected at most one RUN_NAME, got ${#POSITIONAL[@]} arguments"
[[ ${OPT_worker} =~ ^[0-9]+$ ]] || usage_error "--worker needs a worker number, not '${OPT_worker}'"
[[ ${OPT_lines} =~ ^[0-9]+$ ]] || usage_error "--lines needs a number, not '${OPT_lines}'"
require TPU_NAME PROJECT ZONE
need_gcloud

name="${POSITIONAL[0]:-}"
if [[ -n ${name} && ! ${name} =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]]; then
  usage_error "RUN_NAME '${name}': letters, digits, '.', '_', '-'"
fi

from_bucket() {  # the copy in the bucket: the log's last lines, or (no RUN_NAME) the list
  [[ -n ${BUCKET} ]] || die "the copies of the logs are in gs://BUCKET/logs/${TPU_NAME}/: set BUCKET"
  validate_var BUCKET
  local dir
  dir="$(gcs_logs_dir)/worker${OPT_worker}"
  if [[ -z ${name} ]]; then
    note "Logs of worker ${OPT_worker} of ${TPU_NAME} in the bucket (name one to read it):"
    run_cmd gcloud storage ls "${dir}/"
  else
    note "==> ${dir}/${name}.log (the copy in the bucket; the last ${OPT_lines} lines) <=="
    if [[ ${DRY_RUN} == 1 ]]; then
      run_cmd gcloud storage cat "${dir}/${name}.log"
    else
      run_cmd gcloud storage cat "${dir}/${name}.log" | tail -n "${OPT_lines}"
    fi
  fi
}

if [[ ${OPT_bucket} == 1 ]]; then
  from_bucket
  exit
fi
describe=(gcloud compute tpus tpu-vm describe "${TPU_NAME}" "--zone=${ZONE}" "--project=${PROJECT}"
          '--format=value(state)')
if [[ ${DRY_RUN} == 1 ]]; then
  run_cmd "${describe[@]}"  # (a dry run takes the VM to be there)
elif ! run_cmd "${describe[@]}" > /dev/null; then
  echo "${TPU_NAME} is not there (preempted or deleted?): reading the bucket's copy" >&2
  from_bucket
  exit
fi
if [[ -n ${name} ]]; then
  remote_command="tail -n ${OPT_lines} -F ~/logs/${name}.log"
else
  remote_command="f=\$(ls -t ~/logs/*.log 2> /dev/null | head -n 1); if [ -z \"\$f\" ]; then echo \"\$(hostname): no logs in ~/logs\" >&2; exit 1; fi; echo \"==> \$f <==\"; exec tail -n ${OPT_lines} -F \"\$f\""
fi
tpu_ssh "${OPT_worker}" "${remote_command}"
