#!/usr/bin/env bash
# Copies this repository to every worker of the TPU VM and installs it there (venv + jax[tpu]).
#
#   TPU_NAME=relu-vit PROJECT=my-project ZONE=europe-west4-a bash launch/tpu/setup.sh [--dry-run]
#
# How the code gets there: a tarball of this working tree (uncommitted edits included; .git,
# .venv, workdirs/, build/, caches and *.egg-info left out) is made here, copied to every worker
# with `gcloud compute tpus tpu-vm scp ... --worker=all` and unpacked into ~/big_vision_relu,
# replacing the previous copy but keeping its .venv. (Not `scp --recurse .`: that would copy
# .venv and workdirs; not `git archive`: that would drop uncommitted changes.)
# Then on every worker (`ssh --worker=all`): find Python >= 3.11 (tpu-ubuntu2204-base ships 3.10,
# so python3.11 is installed with apt when there is none; or set TPU_PYTHON to one on the
# workers), create ~/big_vision_relu/.venv and `pip install -e '.[tpu]'`.
# Re-run it after changing the code (not while a run is training: it replaces the code).
# Next: launch/tpu/data.sh (once per bucket), then launch/tpu/run.sh or launch/tpu/sweep.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
((${#POSITIONAL[@]} == 0)) || usage_error "unexpected argument '${POSITIONAL[0]}'"
require TPU_NAME PROJECT ZONE
need_gcloud

tarball="${TMPDIR:-/tmp}/big_vision_relu-${TPU_NAME}.tar.gz"
remote_tarball="big_vision_relu.tar.gz"  # relative to the workers' home directory

remote_steps=(
  'set -e'
  "mkdir -p ${REMOTE_DIR} ~/logs"
  "cd ${REMOTE_DIR}"
  'find . -mindepth 1 -maxdepth 1 ! -name .venv -exec rm -rf {} +'
  "tar -xzf ~/${remote_tarball}"
  "rm -f ~/${remote_tarball}"
  "py=${TPU_PYTHON:+$(shell_quote "${TPU_PYTHON}")}"
  'if [ -z "$py" ]; then for c in python3.13 python3.12 python3.11; do if command -v $c > /dev/null && $c -c "import ensurepip" 2> /dev/null; then py=$c; break; fi; done; fi'
  'if [ -z "$py" ]; then echo "$(hostname): no Python >= 3.11 with venv, installing python3.11 with apt"; sudo apt-get -qq -o DPkg::Lock::Timeout=600 update; sudo DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=600 install -y python3.11 python3.11-venv > /dev/null; py=python3.11; fi'
  'if [ -x .venv/bin/python ] && ! .venv/bin/python -c "import sys; sys.exit(sys.version_info < (3, 11))"; then rm -rf .venv; fi'
  'if [ ! -x .venv/bin/python ]; then "$py" -m venv .venv; fi'
  '.venv/bin/python -m pip install -q --upgrade pip'
  '.venv/bin/python -m pip install -q -e ".[tpu]"'
  '.venv/bin/python -c "import sys, jax, big_vision_relu; print(sys.version.split()[0], \"jax\", jax.__version__)"'
  'echo "$(hostname): ready"'
)
remote_command="$(printf '%s; ' "${remote_steps[@]}")"
remote_command="${remote_command%; }"

pack_repo "${tarball}"
tpu_scp "${tarball}" "${remote_tarball}" all
run_cmd rm -f "${tarball}"
tpu_ssh all "${remote_command}"
note "Next: bash launch/tpu/data.sh paper imagenet21k   (once per bucket), then launch/tpu/sweep.sh"
