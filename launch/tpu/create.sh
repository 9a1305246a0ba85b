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
# TPU_VERSION defaults to the generation's runtime (common.sh RUNTIME_VERSION): v2, v3, v4
# tpu-ubuntu2204-base; v5e (v5litepod-N) v2-alpha-tpuv5-lite; v5p v2-alpha-tpuv5; v6e
# v2-alpha-tpuv6e. SPOT=1: a Spot VM (much cheaper, may be preempted; training resumes from its
# last checkpoint when run.sh / sweep.sh is re-run on a new VM).
# --recreate: after a preemption the preempted VM (or queued resource) still exists and blocks
# the name; this deletes it first (without asking), then creates it again:
#        gcloud compute tpus tpu-vm delete $TPU_NAME --zone=$ZONE --project=$PROJECT --quiet
#        gcloud compute tpus queued-resources delete $TPU_NAME ... --force --quiet  (QUEUED=1)
# Then run setup.sh again (a new VM is bare). --dry-run prints the commands only.
# Next: launch/tpu/setup.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OPT_recreate=0
OPTIONS=(--recreate)
parse_args "$@"
((${#POSITIONAL[@]} == 0)) || usage_error "unexpected argument '${POSITIONAL[0]}'"
require TPU_NAME PROJECT ZONE TPU_TYPE
version="$(tpu_runtime_version "${TPU_TYPE}")"
need_gcloud

if [[ ${OPT_recreate} == 1 ]]; then
  if [[ ${QUEUED} == 1 ]]; then
    run_cmd gcloud compute tpus queued-resources delete "${TPU_NAME}" "--zone=${ZONE}" \
      "--project=${PROJECT}" --force --quiet
  else
    run_cmd gcloud compute tpus tpu-vm delete "${TPU_NAME}" "--zone=${ZONE}" \
      "--project=${PROJECT}" --quiet
  fi
fi

spot=()
if [[ ${SPOT} == 1 ]]; then spot=(--spot); fi

if [[ ${QUEUED} == 1 ]]; then
  run_cmd gcloud compute tpus queued-resources create "${TPU_NAME}" "--node-id=${TPU_NAME}" \
    "--accelerator-type=${TPU_TYPE}" "--runtime-version=${version}" "--zone=${ZONE}" \
    "--project=${PROJECT}" "${spot[@]}"
  note "Queued. The VM exists once the queued resource is ACTIVE: bash launch/tpu/status.sh"
else
  run_cmd gcloud compute tpus tpu-vm create "${TPU_NAME}" "--zone=${ZONE}" \
    "--project=${PROJECT}" "--accelerator-type=${TPU_TYPE}" "--version=${version}" \
    "${spot[@]}"
fi
note "${TPU_TYPE}: $(tpu_hosts "${TPU_TYPE}") host(s), $(tpu_tensorcores "${TPU_TYPE}") TensorCores (core hours = TensorCores x hours), runtime ${version}"
note "Next: bash launch/tpu/setup.sh"
