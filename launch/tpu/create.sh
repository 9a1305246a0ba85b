#!/usr/bin/env bash
# Creates the TPU VM (a pod slice: v6e-16 = 4 hosts with 4 chips each; v3-32 = 4 hosts with 8
# TensorCores).
#
#   TPU_NAME=relu-vit PROJECT=my-project ZONE=europe-west4-a TPU_TYPE=v6e-16 \
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
#
# Extra gcloud flags go after `--`, unchanged, to the create command (both kinds take these;
# cloud.google.com/sdk/gcloud/reference/compute/tpus/tpu-vm/create and .../queued-resources/
# create):
#   --reserved                        use a reservation of yours that matches type and zone
#   --network=NET --subnetwork=SUB    a VPC of yours instead of the project's `default` one
#   --service-account=SA@PROJECT.iam.gserviceaccount.com [--scopes=cloud-platform]
#   --internal-ips, --tags=..., --labels=..., (queued) --valid-until-duration=6h
#   e.g. bash launch/tpu/create.sh -- --reserved --network=ml --subnetwork=ml-europe-west4
# A named reservation (`--reservation=NAME`) is a flag of `gcloud alpha` only: set
# GCLOUD_TPU_TRACK=alpha to create through `gcloud alpha compute tpus ...`.
#
# QUEUED=1 then waits until the queued resource is ACTIVE (its VM exists), asking every
# QUEUED_POLL_SECONDS (30) for its state (gcloud compute tpus queued-resources describe
# $TPU_NAME --format=value(state.state)), for QUEUED_TIMEOUT_MINUTES (120) at most; it stops
# with the state it saw at a FAILED or SUSPENDED one, or at the timeout (the request stays
# queued: re-run `QUEUED=1 bash launch/tpu/create.sh --wait-only` to wait again, status.sh to
# look, delete.sh to withdraw it).
# Next: launch/tpu/setup.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OPT_recreate=0
OPT_wait_only=0
OPTIONS=(--recreate --wait-only --)
parse_args "$@"
((${#POSITIONAL[@]} == 0)) || usage_error "unexpected argument '${POSITIONAL[0]}'"
require TPU_NAME PROJECT ZONE TPU_TYPE
version="$(tpu_runtime_version "${TPU_TYPE}")"
QUEUED_POLL_SECONDS="${QUEUED_POLL_SECONDS:-30}"
QUEUED_TIMEOUT_MINUTES="${QUEUED_TIMEOUT_MINUTES:-120}"
for var in QUEUED_POLL_SECONDS QUEUED_TIMEOUT_MINUTES; do validate_var "${var}"; done
GCLOUD_TPU_TRACK="${GCLOUD_TPU_TRACK:-}"
case "${GCLOUD_TPU_TRACK}" in
  ""|alpha|beta) ;;
  *) die "GCLOUD_TPU_TRACK='${GCLOUD_TPU_TRACK}': leave it unset, or alpha or beta" ;;
esac
for flag in "${PASSTHROUGH[@]}"; do
  [[ ${flag} == --* ]] || usage_error "after --, gcloud flags only (--name or --name=value), not '${flag}'"
done
((OPT_wait_only == 0 || QUEUED == 1)) || usage_error "--wait-only waits for a queued resource: set QUEUED=1"
need_gcloud
# shellcheck disable=SC2206  # one optional word
tpus=(gcloud ${GCLOUD_TPU_TRACK} compute tpus)

# wait_until_active: polls the queued resource's state until ACTIVE (see the header).
wait_until_active() {
  local state="" deadline=$((SECONDS + QUEUED_TIMEOUT_MINUTES * 60)) describe
  describe=(gcloud compute tpus queued-resources describe "${TPU_NAME}" "--zone=${ZONE}"
            "--project=${PROJECT}" '--format=value(state.state)')
  if [[ ${DRY_RUN} == 1 ]]; then
    run_cmd "${describe[@]}"
    note "(repeated every ${QUEUED_POLL_SECONDS} s until ACTIVE, for ${QUEUED_TIMEOUT_MINUTES} min at most)"
    return
  fi
  while :; do
    state="$("${describe[@]}")" || die "cannot describe the queued resource ${TPU_NAME} (see above)"
    case "${state}" in
      ACTIVE) echo "${TPU_NAME}: ACTIVE"; return ;;
      FAILED|SUSPENDED|SUSPENDING)
        die "the queued resource ${TPU_NAME} is ${state}, not ACTIVE: see \`gcloud compute tpus queued-resources describe ${TPU_NAME} --zone=${ZONE} --project=${PROJECT}\`; delete it (bash launch/tpu/delete.sh) and create it again" ;;
    esac
    if ((SECONDS >= deadline)); then
      die "the queued resource ${TPU_NAME} is still ${state:-in no state} after ${QUEUED_TIMEOUT_MINUTES} min; it stays queued: wait again with QUEUED=1 bash launch/tpu/create.sh --wait-only, or withdraw it with bash launch/tpu/delete.sh"
    fi
    echo "${TPU_NAME}: ${state:-no state yet}, waiting for ACTIVE ($((SECONDS / 60)) of ${QUEUED_TIMEOUT_MINUTES} min)" >&2
    sleep "${QUEUED_POLL_SECONDS}"
  done
}

if [[ ${OPT_wait_only} == 1 ]]; then
  wait_until_active
  note "Next: bash launch/tpu/setup.sh"
  exit
fi

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
  run_cmd "${tpus[@]}" queued-resources create "${TPU_NAME}" "--node-id=${TPU_NAME}" \
    "--accelerator-type=${TPU_TYPE}" "--runtime-version=${version}" "--zone=${ZONE}" \
    "--project=${PROJECT}" "${spot[@]}" "${PASSTHROUGH[@]}"
  note "Queued; waiting until it is ACTIVE (Ctrl-C stops waiting, not the request)."
  wait_until_active
else
  run_cmd "${tpus[@]}" tpu-vm create "${TPU_NAME}" "--zone=${ZONE}" \
    "--project=${PROJECT}" "--accelerator-type=${TPU_TYPE}" "--version=${version}" \
    "${spot[@]}" "${PASSTHROUGH[@]}"
fi
note "${TPU_TYPE}: $(tpu_hosts "${TPU_TYPE}") host(s), $(tpu_tensorcores "${TPU_TYPE}") TensorCores (core hours = TensorCores x hours), runtime ${version}"
note "Next: bash launch/tpu/setup.sh"
