#!/usr/bin/env bash
# Creates the TPU VM (a pod slice: v3-32 = 4 hosts with 8 TPU cores each).
#
#   TPU_NAME=relu-vit PROJECT=my-project ZONE=europe-west4-a TPU_TYPE=v3-32 \
#     bash launch/tpu/create.sh [--dry-run]
#
# Runs: gcloud compute tpus tpu-vm create $TPU_NAME --zone=$ZONE --project=$PROJECT
#         --accelerator-type=$TPU_TYPE --version=$TPU_VERSION [--spot]
# With QUEUED=1 it requests the TPU through a queued resource named $TPU_NAME whose node is
# also named $TPU_NAME (so every other script works unchanged once it is ACTIVE; watch it with
# launch/tpu/status.sh):
#        gcloud compute tpus queued-resources create $TPU_NAME --node-id=$TPU_NAME
#         --accelerator-type=$TPU_TYPE --runtime-version=$TPU_VERSION --zone=$ZONE
#         --project=$PROJECT [--spot]
# Optional: TPU_VERSION (default tpu-ubuntu2204-base, the runtime for v2-v4 with JAX installed
# by setup.sh), SPOT=1 (Spot VM: much cheaper, may be preempted; training resumes from its last
# checkpoint when run.sh / sweep.sh is re-run on a new VM). --dry-run prints the command only.
# Next: launch/tpu/setup.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
((${#POSITIONAL[@]} == 0)) || usage_error "unexpected argument '${POSITIONAL[0]}'"
require TPU_NAME PROJECT ZONE TPU_TYPE
need_gcloud

spot=()
if [[ ${SPOT} == 1 ]]; then spot=(--spot); fi

if [[ ${QUEUED} == 1 ]]; then
  run_cmd gcloud compute tpus queued-resources create "${TPU_NAME}" "--node-id=${TPU_NAME}" \
    "--accelerator-type=${TPU_TYPE}" "--runtime-version=${TPU_VERSION}" "--zone=${ZONE}" \
    "--project=${PROJECT}" "${spot[@]}"
  note "Queued. The VM exists once the queued resource is ACTIVE: bash launch/tpu/status.sh"
else
  run_cmd gcloud compute tpus tpu-vm create "${TPU_NAME}" "--zone=${ZONE}" \
    "--project=${PROJECT}" "--accelerator-type=${TPU_TYPE}" "--version=${TPU_VERSION}" \
    "${spot[@]}"
fi
note "Next: bash launch/tpu/setup.sh"
