#!/usr/bin/env bash
# Trains one config on ALL workers of the TPU VM (one multi-host JAX job: on a pod every worker
# runs the same command and jax.distributed.initialize() finds the others), in the background
# so the ssh session can end.
#
#   TPU_NAME=relu-vit PROJECT=my-project ZONE=europe-west4-a BUCKET=my-bucket \
#     bash launch/tpu/run.sh CONFIG[:ARGS] RUN_NAME [--dry-run] [-- TRAIN_FLAGS...]
#   e.g. bash launch/tpu/run.sh configs/vit_i21k.py:variant=S/16,attention=relu i21k_s16_relu
#
# On every worker (`gcloud compute tpus tpu-vm ssh $TPU_NAME --worker=all --command ...`):
#   cd ~/big_vision_relu && TFDS_DATA_DIR=gs://$BUCKET/tensorflow_datasets nohup
#     .venv/bin/python -m big_vision_relu.train --config CONFIG[:ARGS]
#     --workdir gs://$BUCKET/runs/RUN_NAME --multihost|--nomultihost [TRAIN_FLAGS...]
#     >> ~/logs/RUN_NAME.log 2>&1 &
#   and a copier of that log to gs://$BUCKET/logs/$TPU_NAME/worker<N>/RUN_NAME.log (every
#   LOG_SYNC_SECONDS, 60, while the trainer runs; logs.sh reads it there once the VM is gone)
# --multihost on a TPU_TYPE of several hosts (every worker calls jax.distributed.initialize(),
# which finds the others), --nomultihost on one host (never initialises).
# One workdir shared by all workers (process 0 writes it). Re-running the same command resumes
# from the last checkpoint (also after a preemption, on a new VM; a finished run exits at once).
# It refuses to start on a worker that is already training (stop that with launch/tpu/stop.sh).
# TRAIN_FLAGS after `--` go to the trainer, e.g. -- --config.lr=3e-3
# Follow the log: bash launch/tpu/logs.sh RUN_NAME. Results: gs://$BUCKET/runs/RUN_NAME.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OPTIONS=(--)
parse_args "$@"
((${#POSITIONAL[@]} == 2)) || usage_error "expected CONFIG[:ARGS] RUN_NAME, got ${#POSITIONAL[@]} argument(s)"
config="${POSITIONAL[0]}"
run_name="${POSITIONAL[1]}"
[[ ${config%%:*} == *.py ]] ||
  usage_error "CONFIG must be a config file path (relative to the repository), e.g. configs/vit_i21k.py:variant=S/16"
[[ -f ${REPO_DIR}/${config%%:*} ]] || usage_error "no config file ${config%%:*} in ${REPO_DIR}"
[[ ${run_name} =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] ||
  usage_error "RUN_NAME '${run_name}': use letters, digits, '.', '_' and '-' (it names the workdir and the log)"
require TPU_NAME PROJECT ZONE BUCKET TPU_TYPE
validate_var LOG_SYNC_SECONDS
multihost="$(multihost_flag "${TPU_TYPE}")"
need_gcloud

workdir="$(gcs_runs_dir)/${run_name}"
# shellcheck disable=SC2088  # expanded by the workers' shell
log="~/logs/${run_name}.log"
train=(.venv/bin/python -m big_vision_relu.train --config "${config}" --workdir "${workdir}"
       "${multihost}" "${PASSTHROUGH[@]}")
remote_command="set -e; mkdir -p ~/logs; cd ${REMOTE_DIR}; ${REMOTE_BUSY_CHECK}; TFDS_DATA_DIR=$(gcs_data_dir) nohup $(shell_quote "${train[@]}") >> ${log} 2>&1 < /dev/null & $(log_sync "${run_name}")echo \"\$(hostname): started ${run_name}, log ${log}, copied to $(gcs_logs_dir)/worker<N>/\""
tpu_ssh all "${remote_command}"
note "Follow it: bash launch/tpu/logs.sh ${run_name}    Results: ${workdir}"
