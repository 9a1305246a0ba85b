#!/usr/bin/env bash
# Runs every run of a sweep (a figure's list of configs) on TPU VMs, restart-safe.
#
#   TPU_NAME=relu-vit PROJECT=my-project ZONE=europe-west4-a BUCKET=my-bucket \
#     bash launch/tpu/sweep.sh configs/paper/fig1.py [--dry-run]
#   PROJECT=my-project ZONE=europe-west4-a BUCKET=my-bucket \
#     bash launch/tpu/sweep.sh configs/paper/fig1.py --vms relu-a,relu-b [--dry-run]
#
# The runs come from `python -m big_vision_relu.experiments.sweep SWEEP_FILE --list`, run here
# (with .venv/bin/python if there is one, else python3), as `<run id> <config>`. Run ids are
# stable, and each run's workdir is gs://$BUCKET/runs/<run id>, whichever sweeps list it: a run
# shared by several figures (Figure 3's qk-LN-on half is Figure 2's) trains once, and the second
# sweep finds it finished (`python -m big_vision_relu.experiments.report --root gs://$BUCKET`
# reads the same paths).
# One VM ($TPU_NAME): the runs go one after another. A loop script (~/sweeps/<sweep>.sh, shown by
# --dry-run) is copied to every worker and started on all of them in the background; every
# worker runs the same sequence, so each run is one multi-host job. Log: ~/logs/<sweep>.log on
# each worker (bash launch/tpu/logs.sh fig1).
# --vms A,B,...: the runs are dealt round-robin (run i to VM i mod N, in list order) and each VM
# runs its share as above; every VM must exist and have been set up (TPU_NAME=A bash
# launch/tpu/setup.sh, ...) in the same ZONE and PROJECT, all of type TPU_TYPE. TPU_NAME is not
# used. TPU_TYPE decides --multihost (several hosts: jax.distributed.initialize() on every
# worker) or --nomultihost (one host: never).
# Restart-safe: the trainer resumes an unfinished run from its checkpoint and exits at once for
# a finished one, so re-running this command (e.g. after a preemption, on a new VM) continues
# the sweep where it stopped. A failed run (e.g. a non-finite loss) is logged and the loop goes
# on. A run that exits 75 (a lost peer) or 79 (preempted: saved, not finished) is started again
# after SWEEP_RETRY_SECONDS (30), up to SWEEP_MAX_ATTEMPTS (3) attempts in all; only a run that
# exits 0 counts as done (the last log line: done / stopped / failed runs; the loop script's
# status is 0 only if all are done). launch/tpu/stop.sh stops the loop too (no retry, no next
# run). Each worker's log is copied to gs://$BUCKET/logs/<VM>/worker<N>/<sweep>.log as it grows.
# It refuses to start on a VM that is already training (launch/tpu/stop.sh stops that).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
OPTIONS=(--vms=)
OPT_vms=""
parse_args "$@"
((${#POSITIONAL[@]} == 1)) || usage_error "expected one SWEEP_FILE, got ${#POSITIONAL[@]} argument(s)"
sweep_file="${POSITIONAL[0]}"
[[ -f ${sweep_file} ]] || usage_error "no sweep file '${sweep_file}' (e.g. configs/paper/fig1.py)"
[[ ${sweep_file} == *.py ]] || usage_error "SWEEP_FILE must be a .py file, not '${sweep_file}'"
sweep_file="$(cd "$(dirname "${sweep_file}")" && pwd)/$(basename "${sweep_file}")"
sweep="$(basename "${sweep_file}" .py)"
[[ ${sweep} =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || usage_error "sweep name '${sweep}': use letters, digits, '.', '_', '-'"

if [[ -n ${OPT_vms} ]]; then
  IFS=',' read -r -a vms <<< "${OPT_vms}"
  for ((v = 0; v < ${#vms[@]}; v++)); do
    [[ ${vms[v]} =~ ^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$ ]] ||
      usage_error "--vms: '${vms[v]}' is not a TPU VM name (lowercase letters, digits, hyphens)"
    for ((w = 0; w < v; w++)); do
      [[ ${vms[w]} != "${vms[v]}" ]] || usage_error "--vms: ${vms[v]} is given twice"
    done
  done
  require PROJECT ZONE BUCKET TPU_TYPE
else
  require TPU_NAME PROJECT ZONE BUCKET TPU_TYPE
  vms=("${TPU_NAME}")
fi
multihost="$(multihost_flag "${TPU_TYPE}")"
SWEEP_MAX_ATTEMPTS="${SWEEP_MAX_ATTEMPTS:-3}"
SWEEP_RETRY_SECONDS="${SWEEP_RETRY_SECONDS:-30}"
for var in SWEEP_MAX_ATTEMPTS SWEEP_RETRY_SECONDS LOG_SYNC_SECONDS; do validate_var "${var}"; done
need_gcloud

# The runs: "<id>\t<config>" lines.
python="$(local_python)"
if ! listing="$(cd "${REPO_DIR}" \
                 && "${python}" -m big_vision_relu.experiments.sweep "${sweep_file}" --list)"; then
  die "could not list the runs of ${sweep_file} with ${python} (it needs Python >= 3.10 with absl-py: pip install absl-py, or create the repo's .venv with bash launch/test.sh)"
fi
ids=()
configs=()
while IFS=$'\t' read -r id config; do
  [[ -z ${id} ]] && continue
  [[ ${id} =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ && -n ${config} ]] ||
    die "unexpected line from the sweep listing: '${id}	${config}'"
  ids+=("${id}")
  configs+=("${config}")
done <<< "${listing}"
((${#ids[@]})) || die "${sweep_file} lists no runs"

data_dir="$(gcs_data_dir)"
root="$(gcs_runs_dir)"
n_vms=${#vms[@]}
if [[ ${DRY_RUN} == 1 ]]; then
  tmp="${TMPDIR:-/tmp}/big_vision_relu-sweep.XXXXXX"
else
  tmp="$(mktemp -d "${TMPDIR:-/tmp}/big_vision_relu-sweep.XXXXXX")"
  trap 'rm -rf "${tmp}"' EXIT
fi
note "${sweep}: ${#ids[@]} runs on ${n_vms} VM(s): ${vms[*]}; workdirs ${root}/<run id>"

failed_vms=()
for ((v = 0; v < n_vms; v++)); do
  VM="${vms[v]}"
  mine=()
  for ((i = v; i < ${#ids[@]}; i += n_vms)); do mine+=("${i}"); done
  ((${#mine[@]})) || { note "${VM}: no runs"; continue; }

  script="#!/usr/bin/env bash
# Sweep ${sweep} on TPU VM ${VM}: ${#mine[@]} of the ${#ids[@]} runs of ${sweep_file#"${REPO_DIR}"/},
# one after another. Written by launch/tpu/sweep.sh; every worker runs this same sequence.
# Restart-safe: a finished run exits at once, an unfinished one resumes from its checkpoint.
# A run that exits ${PEER_LOST} (a lost peer) or ${PREEMPTED} (preempted: saved, not finished) is
# started again (it resumes), ${SWEEP_MAX_ATTEMPTS} attempts in all; only exit 0 counts as done.
# SIGTERM (launch/tpu/stop.sh) lets the running trainer save and starts nothing more.
main() {
  cd ${REMOTE_DIR} || exit 1
  export TFDS_DATA_DIR=${data_dir}
  local finished=() stopped=() failed=() stopping=0
  trap 'stopping=1' TERM
  run() {  # run RUN_ID CONFIG WORKDIR
    local attempt rc
    for ((attempt = 1; ; attempt++)); do
      ((stopping)) && { stopped+=(\"\$1\"); return; }
      echo \"== \$(date -u +%FT%TZ) start \$1 (attempt \$attempt of ${SWEEP_MAX_ATTEMPTS}): --config \$2 --workdir \$3\"
      rc=0
      .venv/bin/python -m big_vision_relu.train --config \"\$2\" --workdir \"\$3\" ${multihost} || rc=\$?
      if ((rc == 0)); then
        echo \"== \$(date -u +%FT%TZ) end \$1 (exit 0)\"
        finished+=(\"\$1\")
        return
      elif ((rc != ${PEER_LOST} && rc != ${PREEMPTED})); then
        echo \"== \$(date -u +%FT%TZ) FAILED \$1 (exit \$rc)\"
        failed+=(\"\$1\")
        return
      elif ((stopping || attempt >= ${SWEEP_MAX_ATTEMPTS})); then
        echo \"== \$(date -u +%FT%TZ) STOPPED \$1 (exit \$rc, attempt \$attempt): saved, not finished; re-running the sweep resumes it\"
        stopped+=(\"\$1\")
        return
      fi
      echo \"== \$(date -u +%FT%TZ) RETRY \$1 (exit \$rc: \$( ((rc == ${PEER_LOST})) && echo 'a lost peer' || echo 'preempted')) in ${SWEEP_RETRY_SECONDS} s\"
      sleep ${SWEEP_RETRY_SECONDS} & wait \$!
    done
  }"
  for i in "${mine[@]}"; do
    script+="
  run $(shell_quote "${ids[i]}" "${configs[i]}" "${root}/${ids[i]}")"
  done
  script+="
  echo \"== \$(date -u +%FT%TZ) sweep ${sweep} on ${VM}: ${#mine[@]} runs, \${#finished[@]} done; stopped: \${stopped[*]:-none}; failed: \${failed[*]:-none}\"
  ((\${#finished[@]} == ${#mine[@]}))
}
main \"\$@\"
exit
"
  local_script="${tmp}/${sweep}-${VM}.sh"
  remote_new="big_vision_relu-sweep-${sweep}.sh.new"  # in the workers' home directory
  if [[ ${DRY_RUN} == 1 ]]; then
    note "loop script for ${VM} (written to ${local_script}, then copied to every worker):"
    while IFS= read -r line; do printf '#| %s\n' "${line}"; done <<< "${script%$'\n'}"
  else
    printf '%s' "${script}" > "${local_script}"
  fi
  remote_command="set -e; mkdir -p ~/logs ~/sweeps; ${REMOTE_BUSY_CHECK}; mv -f ~/${remote_new} ~/sweeps/${sweep}.sh; nohup bash ~/sweeps/${sweep}.sh >> ~/logs/${sweep}.log 2>&1 < /dev/null & $(log_sync "${sweep}")echo \"\$(hostname): started sweep ${sweep} (${#mine[@]} runs), log ~/logs/${sweep}.log, copied to $(gcs_logs_dir)/worker<N>/\""
  # A VM that fails (not set up, busy, unreachable) does not keep the others from starting.
  if ! { tpu_scp "${local_script}" "${remote_new}" all && tpu_ssh all "${remote_command}"; }; then
    failed_vms+=("${VM}")
  fi
done
note "Follow: TPU_NAME=${vms[0]} bash launch/tpu/logs.sh ${sweep}    Results: ${root}/<run id>"
if ((${#failed_vms[@]})); then
  die "the sweep did not start on: ${failed_vms[*]} (see above); fix that and run the same command again (the VMs already running refuse, as busy, and keep going)"
fi
