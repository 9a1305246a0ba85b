#!/usr/bin/env bash
# Follows a log on one worker (tail -F, until Ctrl-C): a run's or a sweep's (data.sh follows
# its own builds' log on its CPU VM).
#
#   TPU_NAME=relu-vit PROJECT=my-project ZONE=europe-west4-a \
#     bash launch/tpu/logs.sh [RUN_NAME] [--worker=N] [--lines=N] [--dry-run]
#
# RUN_NAME: the run.sh RUN_NAME or the sweep name (e.g. fig1); the log is
# ~/logs/RUN_NAME.log on worker N (default 0: process 0 logs the metrics). Without RUN_NAME:
# the newest log there. Runs: gcloud compute tpus tpu-vm ssh $TPU_NAME --zone=$ZONE
#   --project=$PROJECT --worker=N --command='tail -n LINES -F ~/logs/RUN_NAME.log'
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OPTIONS=(--worker= --lines=)
OPT_worker=0
OPT_lines=50
parse_args "$@"
((${#POSITIONAL[@]} <= 1)) || usage_error "expected at most one RUN_NAME, got ${#POSITIONAL[@]} arguments"
[[ ${OPT_worker} =~ ^[0-9]+$ ]] || usage_error "--worker needs a worker number, not '${OPT_worker}'"
[[ ${OPT_lines} =~ ^[0-9]+$ ]] || usage_error "--lines needs a number, not '${OPT_lines}'"
require TPU_NAME PROJECT ZONE
need_gcloud

if ((${#POSITIONAL[@]})); then
  name="${POSITIONAL[0]}"
  [[ ${name} =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || usage_error "RUN_NAME '${name}': letters, digits, '.', '_', '-'"
  remote_command="tail -n ${OPT_lines} -F ~/logs/${name}.log"
else
  remote_command="f=\$(ls -t ~/logs/*.log 2> /dev/null | head -n 1); if [ -z \"\$f\" ]; then echo \"\$(hostname): no logs in ~/logs\" >&2; exit 1; fi; echo \"==> \$f <==\"; exec tail -n ${OPT_lines} -F \"\$f\""
fi
tpu_ssh "${OPT_worker}" "${remote_command}"
