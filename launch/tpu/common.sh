# shellcheck shell=bash
# Shared by every launch/tpu/*.sh script (sourced, never run):
#
#   source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
#
# Configuration comes from environment variables; each script asks for the ones it needs with
# `require`, which reports every missing one in a single message before anything runs:
#
#   TPU_NAME     name of the TPU VM (with QUEUED=1 also the queued resource's name)
#   PROJECT      Google Cloud project id
#   ZONE         zone of the TPU VM, e.g. europe-west4-a
#   BUCKET       GCS bucket for datasets and runs, `my-bucket` or `gs://my-bucket`
#   TPU_TYPE     accelerator type, e.g. v6e-16 (4 hosts), v6e-8 (1 host), v5litepod-16, v3-32
#   TPU_VERSION  TPU software (runtime) version (default: RUNTIME_VERSION's entry for the
#                TPU_TYPE's generation, below)
#   QUEUED=1     create / delete / describe through a queued resource (default: a plain TPU VM)
#   SPOT=1       a Spot (preemptible) TPU VM
#   DRY_RUN=1    same as --dry-run
#
# Every script takes --dry-run (print each command, quoted, one per line after `+ `, instead of
# running it; needs neither gcloud nor credentials) and -h/--help (print its usage header).
#
# data.sh runs on a CPU VM of its own (never on the TPU): DATA_VM (default relu-vit-data),
# DATA_MACHINE_TYPE (default n2-standard-32), DATA_DISK_GB (default 2000), DATA_MAX_HOURS
# (default 72), DATA_SERVICE_ACCOUNT (default: the project's Compute Engine default account),
# DATA_PROGRESS_SECONDS (default 600: how often data.log gets each build's progress).
#
# Layout on the workers: the code in ~/big_vision_relu (venv in ~/big_vision_relu/.venv),
# logs in ~/logs/NAME.log, sweep loop scripts in ~/sweeps/. In the bucket: datasets in
# gs://$BUCKET/tensorflow_datasets, runs in gs://$BUCKET/runs/RUN_NAME.

if ((BASH_VERSINFO[0] < 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] < 4))); then
  echo "error: these scripts need bash >= 4.4 (this is ${BASH_VERSION}); on macOS:" \
       "brew install bash" >&2
  exit 2
fi

LAUNCH_TPU_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(cd "${LAUNCH_TPU_DIR}/../.." && pwd)"
SCRIPT_NAME="launch/tpu/$(basename "$0")"
# shellcheck disable=SC2034,SC2088  # used by the scripts; the workers' shell expands the ~
REMOTE_DIR='~/big_vision_relu'

TPU_VERSION="${TPU_VERSION:-}"
QUEUED="${QUEUED:-0}"
SPOT="${SPOT:-0}"
DRY_RUN="${DRY_RUN:-0}"
for _flag in DRY_RUN QUEUED SPOT; do
  if [[ ${!_flag} != 0 && ${!_flag} != 1 ]]; then
    echo "error: ${_flag} must be 0 or 1 (or unset), not '${!_flag}'" >&2
    exit 2
  fi
done
unset _flag
BUCKET="${BUCKET:-}"
BUCKET="${BUCKET#gs://}"
BUCKET="${BUCKET%/}"

# What `require` says about each variable: "<meaning>|<example value>".
declare -A VAR_HELP=(
  [TPU_NAME]="name of the TPU VM (with QUEUED=1 also the queued resource's name)|relu-vit"
  [PROJECT]="Google Cloud project id|my-project"
  [ZONE]="zone of the TPU VM, one that offers TPU_TYPE (cloud.google.com/tpu/docs/regions-zones)|europe-west4-a"
  [BUCKET]="GCS bucket for datasets and runs, ideally in the TPU's region|my-bucket"
  [TPU_TYPE]="accelerator type: v6e-16 is a pod slice of 4 hosts (16 chips), v6e-8 a single host; v5litepod-N, v5p-N, v4-N, v3-N too|v6e-16"
  [MANUAL_DIR]="imagenet21k is a manual download (image-net.org, after accepting its terms: winter21_whole.tar.gz today, or the paper's fall11_whole.tar if you have it); this is the directory (gs://...) of the release's unpacked per-synset tars n*.tar (tar xzf winter21_whole.tar.gz, or tar xf fall11_whole.tar -C DIR), one release per directory|gs://my-bucket/imagenet21k_winter2021_tars"
  [IMAGENET2012_MANUAL_DIR]="imagenet2012 is a manual download too (image-net.org, after accepting its terms; TFDS cannot fetch it); this is the directory (gs://... or on worker 0) holding ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar|gs://my-bucket/imagenet2012_tars"
  [CARS196_MANUAL_DIR]="cars196's download is gone (tensorflow/datasets#5053); this is the directory (gs://...) holding car_devkit.tgz cars_train.tgz cars_test.tgz cars_test_annos_withlabels.mat, checked by sha256 (where to get them: python -m big_vision_relu.data.prepare --datasets=cars196)|gs://my-bucket/cars196_files"
)

die() {  # die MESSAGE...: print "error: MESSAGE" to stderr and exit 1
  printf 'error: %s\n' "$*" >&2
  exit 1
}

# usage, usage_error: the calling script's header comment as its usage.
# shellcheck source=../usage.sh
source "$(dirname "${BASH_SOURCE[0]}")/../usage.sh"

# parse_args "$@": the options every script shares, plus the script's own ones declared before
# the call in OPTIONS, e.g. OPTIONS=(--yes --vms=) ("=" marks an option taking a value, given as
# `--vms X` or `--vms=X`; a flag sets OPT_yes=1, a value sets OPT_vms=X). `--` ends the options
# when OPTIONS contains `--` (the rest goes to PASSTHROUGH). Positional arguments go to
# POSITIONAL. Anything else starting with `-` is an error.
OPTIONS=()
POSITIONAL=()
PASSTHROUGH=()
parse_args() {
  local arg name value spec known
  while (($#)); do
    arg="$1"
    shift
    case "${arg}" in
      --dry-run) DRY_RUN=1; continue ;;
      -h|--help) usage; exit 0 ;;
    esac
    if [[ ${arg} == -* ]]; then
      name="${arg%%=*}"
      known=""
      for spec in "${OPTIONS[@]}"; do
        if [[ ${spec%=} == "${name}" ]]; then known="${spec}"; fi
      done
      if [[ -z ${known} ]]; then
        usage_error "unknown option '${arg}'"
      elif [[ ${known} == -- ]]; then
        # shellcheck disable=SC2034  # read by the scripts that accept `--`
        PASSTHROUGH=("$@")
        break
      elif [[ ${known} == *= ]]; then
        if [[ ${arg} == *=* ]]; then
          value="${arg#*=}"
        elif (($#)); then
          value="$1"
          shift
        else
          usage_error "option ${name} needs a value"
        fi
        [[ -n ${value} ]] || usage_error "option ${name} needs a non-empty value"
        name="${name#--}"
        printf -v "OPT_${name//-/_}" '%s' "${value}"
      else
        [[ ${arg} != *=* ]] || usage_error "option ${name} takes no value"
        name="${name#--}"
        printf -v "OPT_${name//-/_}" '%s' 1
      fi
    else
      POSITIONAL+=("${arg}")
    fi
  done
}

# require VAR...: checks all the variables first, then reports every missing one together
# (what each is, and one export line to copy) and exits 2. Also validates the ones given.
require() {
  local var missing=() example=()
  for var in "$@"; do
    if [[ -z ${!var:-} ]]; then
      missing+=("${var}")
    fi
  done
  if ((${#missing[@]})); then
    {
      printf 'error: %s needs %s to be set; missing: %s\n' "${SCRIPT_NAME}" \
        "$(if ((${#missing[@]} == 1)); then echo 'this environment variable'; else echo 'these environment variables'; fi)" \
        "${missing[*]}"
      for var in "${missing[@]}"; do
        printf '  %-24s %s\n' "${var}" "${VAR_HELP[${var}]%%|*}"
        example+=("${var}=${VAR_HELP[${var}]#*|}")
      done
      printf 'for example:\n  export %s\n' "${example[*]}"
      printf 'then run the same command again (add --dry-run to see the gcloud commands first).\n'
    } >&2
    exit 2
  fi
  for var in "$@"; do
    validate_var "${var}"
  done
}

validate_var() {  # validate_var NAME: a clear error now rather than a confusing one from gcloud
  local value="${!1}"
  case "$1" in
    TPU_NAME)
      [[ ${value} =~ ^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$ ]] ||
        die "TPU_NAME='${value}': use lowercase letters, digits and hyphens, starting with a letter" ;;
    BUCKET)
      [[ ${value} =~ ^[a-z0-9][-a-z0-9_.]*[a-z0-9]$ ]] ||
        die "BUCKET='${value}' is not a bucket name (e.g. my-bucket or gs://my-bucket)" ;;
    ZONE)
      [[ ${value} =~ ^[a-z]+-[a-z]+[0-9]+-[a-z]$ ]] ||
        die "ZONE='${value}' is not a zone (e.g. europe-west4-a)" ;;
    DATA_VM)
      [[ ${value} =~ ^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$ ]] ||
        die "DATA_VM='${value}': use lowercase letters, digits and hyphens, starting with a letter" ;;
    DATA_DISK_GB|DATA_MAX_HOURS|DATA_PROGRESS_SECONDS|SWEEP_MAX_ATTEMPTS|LOG_SYNC_SECONDS|QUEUED_POLL_SECONDS)
      [[ ${value} =~ ^[1-9][0-9]*$ ]] || die "$1='${value}' is not a whole number >= 1" ;;
    SWEEP_RETRY_SECONDS|QUEUED_TIMEOUT_MINUTES)
      [[ ${value} =~ ^[0-9]+$ ]] || die "$1='${value}' is not a whole number" ;;
    DATA_MACHINE_TYPE)
      [[ ${value} =~ ^[a-z][a-z0-9]*-[a-z0-9-]+$ ]] ||
        die "DATA_MACHINE_TYPE='${value}' is not a machine type (e.g. n2-standard-32)" ;;
    TPU_TYPE)
      [[ ${value} =~ ^v[0-9]+[a-z]*(-[a-z]+)?-[0-9]+$ ]] ||
        die "TPU_TYPE='${value}' is not an accelerator type (e.g. v3-32, v4-64, v5litepod-16)" ;;
  esac
  return 0
}

# shell_quote ARG...: one line that a POSIX shell parses back into exactly these arguments
# (plain words as they are, anything else in single quotes).
shell_quote() {
  local arg out=() q="'"
  for arg in "$@"; do
    if [[ ${arg} =~ ^[-A-Za-z0-9_@%+=:,./]+$ ]]; then
      out+=("${arg}")
    else
      out+=("${q}${arg//${q}/${q}\\${q}${q}}${q}")
    fi
  done
  printf '%s\n' "${out[*]}"
}

# run_cmd CMD ARG...: with --dry-run prints `+ CMD ARG...` (quoted, one line) to stdout and
# does nothing; otherwise prints the same line to stderr and runs the command.
run_cmd() {
  if [[ ${DRY_RUN} == 1 ]]; then
    printf '+ %s\n' "$(shell_quote "$@")"
  else
    printf '+ %s\n' "$(shell_quote "$@")" >&2
    "$@"
  fi
}

note() {  # note MESSAGE...: a line for the user (stdout, prefixed with "# " in dry runs)
  if [[ ${DRY_RUN} == 1 ]]; then printf '# %s\n' "$*"; else printf '%s\n' "$*"; fi
}

need_gcloud() {  # fails early, and only when commands will really run
  [[ ${DRY_RUN} == 1 ]] && return 0
  command -v gcloud > /dev/null ||
    die "gcloud not found on PATH: install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), then 'gcloud auth login'; or add --dry-run to only print the commands"
}

# ssh / scp to the TPU VM $VM (default $TPU_NAME).
tpu_ssh() {  # tpu_ssh WORKER COMMAND: runs COMMAND (one shell line) on worker WORKER or "all"
  run_cmd gcloud compute tpus tpu-vm ssh "${VM:-${TPU_NAME}}" "--zone=${ZONE}" \
    "--project=${PROJECT}" "--worker=$1" "--command=$2"
}

tpu_scp() {  # tpu_scp LOCAL_FILE REMOTE_PATH WORKER: copies to the home dir of the worker(s)
  run_cmd gcloud compute tpus tpu-vm scp "$1" "${VM:-${TPU_NAME}}:$2" "--worker=$3" \
    "--zone=${ZONE}" "--project=${PROJECT}"
}

# The trainer's exit statuses that mean "re-run to resume" (big_vision_relu/train.py's docstring;
# tests/test_launch_tpu.py checks them against the Python constants): a lost peer
# (multihost.PEER_LOST_EXIT_CODE) and a preemption notice, saved, not finished
# (preemption.PREEMPTED_EXIT_CODE).
# shellcheck disable=SC2034  # used by sweep.sh
PEER_LOST=75
# shellcheck disable=SC2034
PREEMPTED=79

# Worker logs are copied to gs://$BUCKET/logs/<TPU VM>/worker<N>/<name>.log every
# LOG_SYNC_SECONDS (default 60) while their job runs, and once more when it ends, so that they
# outlive a preempted VM (logs.sh reads them there once the VM is gone).
LOG_SYNC_SECONDS="${LOG_SYNC_SECONDS:-60}"
gcs_logs_dir() { printf 'gs://%s/logs/%s\n' "${BUCKET}" "${VM:-${TPU_NAME}}"; }

# log_sync NAME: remote shell words that start, on each worker, a background copier of
# ~/logs/NAME.log for the job whose pid is in $! (call it right after starting the job with &).
# The worker number comes from the VM's metadata server (agent-worker-number), else hostname.
# shellcheck disable=SC2016  # expanded by the workers' bash -c
LOG_SYNC_LOOP='w=$(curl -sf -m 5 -H Metadata-Flavor:Google http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number || hostname); while :; do gcloud storage cp --quiet "$HOME/logs/$1.log" "$2/worker$w/$1.log" > /dev/null 2>&1; kill -0 "$3" 2> /dev/null || break; sleep "$4"; done'
log_sync() {
  printf 'job=$!; nohup bash -c %s log-sync %s %s "$job" %s > /dev/null 2>&1 < /dev/null & ' \
    "$(shell_quote "${LOG_SYNC_LOOP}")" "$(shell_quote "$1")" "$(gcs_logs_dir)" \
    "${LOG_SYNC_SECONDS}"
}

# What runs on the workers, as `pgrep -f` patterns: a trainer, and a sweep loop script. They
# are anchored at the start of the command line, so they never match the ssh shell (`bash -c
# ...`) whose command mentions them.
TRAIN_PATTERN='^[^ ]*python[^ ]* -m big_vision_relu[.]train '
SWEEP_PATTERN='^bash [^ ]*/sweeps/[^ ]*[.]sh'
# Remote shell snippet: refuses to start when this worker already runs a trainer or a sweep
# loop (two programs cannot share the TPU).
# shellcheck disable=SC2034  # used by run.sh and sweep.sh
REMOTE_BUSY_CHECK="if pgrep -f \"${TRAIN_PATTERN}|${SWEEP_PATTERN}\" > /dev/null; then echo \"\$(hostname): busy, already running:\" >&2; pgrep -af \"${TRAIN_PATTERN}|${SWEEP_PATTERN}\" >&2; echo \"wait for it, or stop it: bash launch/tpu/stop.sh\" >&2; exit 1; fi"

# pack_repo TARBALL: this working tree (uncommitted edits included; .git, .venv, workdirs/,
# build/, caches and *.egg-info left out) as a .tar.gz, to unpack on a VM.
pack_repo() {
  run_cmd tar -czf "$1" --exclude=.git --exclude=.venv --exclude=./workdirs \
    --exclude=./build --exclude=__pycache__ --exclude='*.egg-info' --exclude=.pytest_cache \
    --exclude=.ruff_cache -C "${REPO_DIR}" .
}

# ssh / scp to the plain Compute Engine VM $DATA_VM (data.sh's CPU VM).
vm_ssh() {  # vm_ssh COMMAND: runs COMMAND (one shell line) on the VM
  run_cmd gcloud compute ssh "${DATA_VM}" "--zone=${ZONE}" "--project=${PROJECT}" "--command=$1"
}

vm_scp() {  # vm_scp LOCAL_FILE REMOTE_PATH: copies to the VM's home directory
  run_cmd gcloud compute scp "$1" "${DATA_VM}:$2" "--zone=${ZONE}" "--project=${PROJECT}"
}

gcs_data_dir() { printf 'gs://%s/tensorflow_datasets\n' "${BUCKET}"; }
gcs_runs_dir() { printf 'gs://%s/runs\n' "${BUCKET}"; }

# python3 here, for the few local steps (the repo's venv if there is one).
local_python() {
  if [[ -x ${REPO_DIR}/.venv/bin/python ]]; then
    printf '%s\n' "${REPO_DIR}/.venv/bin/python"
  elif command -v python3 > /dev/null; then
    printf '%s\n' python3
  else
    die "no python3 on PATH (and no ${REPO_DIR}/.venv)"
  fi
}

# The TPU generations these scripts know, from TPU_TYPE's prefix, and each one's runtime (TPU
# software) version: cloud.google.com/tpu/docs/runtimes (v5e, v5p and v6e need their own).
declare -A RUNTIME_VERSION=(
  [v2]=tpu-ubuntu2204-base [v3]=tpu-ubuntu2204-base [v4]=tpu-ubuntu2204-base
  [v5e]=v2-alpha-tpuv5-lite [v5p]=v2-alpha-tpuv5 [v6e]=v2-alpha-tpuv6e
)

tpu_generation() {  # tpu_generation TPU_TYPE: v2 v3 v4 v5e v5p v6e, or exits with an error
  case "$1" in
    v2-[0-9]*) echo v2 ;;
    v3-[0-9]*) echo v3 ;;
    v4-[0-9]*) echo v4 ;;
    v5litepod-[0-9]*) echo v5e ;;
    v5p-[0-9]*) echo v5p ;;
    v6e-[0-9]*) echo v6e ;;
    *) die "TPU_TYPE='$1': unknown generation; these scripts know v2-N, v3-N, v4-N, v5litepod-N (v5e), v5p-N and v6e-N" ;;
  esac
}

# tpu_tensorcores TPU_TYPE: TensorCores in the slice, the unit of the paper's "core hours".
# v2, v3, v4 and v5p types count TensorCores (v4 and v5p have 2 per chip, which JAX shows as one
# device); v5e and v6e types count chips of 1 TensorCore each.
tpu_tensorcores() {
  local generation
  generation="$(tpu_generation "$1")" || exit 1
  echo "${1##*-}"
}

# tpu_hosts TPU_TYPE: TPU VM hosts (workers) in the slice. v2/v3/v4/v5p: 8 TensorCores per host;
# v5e/v6e: up to 8 chips on one host, 4 chips per host in larger slices.
tpu_hosts() {
  local generation n
  generation="$(tpu_generation "$1")" || exit 1
  n="${1##*-}"
  case "${generation}" in
    v5e|v6e) if ((n <= 8)); then echo 1; else echo $((n / 4)); fi ;;
    *) echo $(((n + 7) / 8)) ;;
  esac
}

# tpu_runtime_version TPU_TYPE: $TPU_VERSION if set, else the generation's runtime.
tpu_runtime_version() {
  local generation
  generation="$(tpu_generation "$1")" || exit 1
  echo "${TPU_VERSION:-${RUNTIME_VERSION[${generation}]}}"
}

# multihost_flag TPU_TYPE: the trainer's flag saying whether to call jax.distributed.initialize():
# --multihost on a slice of several hosts (a Cloud TPU VM sets no variable that says so; JAX
# then finds the workers itself), --nomultihost on one host, which never initialises.
multihost_flag() {
  local hosts
  hosts="$(tpu_hosts "$1")" || exit 1
  if ((hosts > 1)); then echo --multihost; else echo --nomultihost; fi
}
