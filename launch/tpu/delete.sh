#!/usr/bin/env bash
# Deletes the TPU VM (with QUEUED=1: the queued resource and its VM). The bucket is untouched:
# datasets and runs (checkpoints, metrics) stay in gs://$BUCKET.
#
#   TPU_NAME=relu-vit PROJECT=my-project ZONE=europe-west4-a bash launch/tpu/delete.sh [--yes] [--dry-run]
#
# Runs: gcloud compute tpus tpu-vm delete $TPU_NAME --zone=$ZONE --project=$PROJECT [--quiet]
#   or, QUEUED=1: gcloud compute tpus queued-resources delete $TPU_NAME --zone=$ZONE
#                   --project=$PROJECT --force [--quiet]   (--force: the VM too)
# gcloud asks for confirmation unless --yes is given (which adds --quiet).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OPTIONS=(--yes)
OPT_yes=0
parse_args "$@"
((${#POSITIONAL[@]} == 0)) || usage_error "unexpected argument '${POSITIONAL[0]}'"
require TPU_NAME PROJECT ZONE
need_gcloud

quiet=()
if [[ ${OPT_yes} == 1 ]]; then quiet=(--quiet); fi

if [[ ${QUEUED} == 1 ]]; then
  run_cmd gcloud compute tpus queued-resources delete "${TPU_NAME}" "--zone=${ZONE}" \
    "--project=${PROJECT}" --force "${quiet[@]}"
else
  run_cmd gcloud compute tpus tpu-vm delete "${TPU_NAME}" "--zone=${ZONE}" \
    "--project=${PROJECT}" "${quiet[@]}"
fi
