#!/usr/bin/env bash
# Prepares TFDS datasets (ArrayRecord, as the input pipeline needs) into
# gs://$BUCKET/tensorflow_datasets, once per bucket. Runs on worker 0 only, in the background
# (nohup-style, so the ssh session can end), one dataset after another, logging to
# ~/logs/data.log on worker 0 (follow it with: bash launch/tpu/logs.sh data).
#
#   TPU_NAME=relu-vit PROJECT=my-project ZONE=europe-west4-a BUCKET=my-bucket \
#     MANUAL_DIR=gs://my-bucket/imagenet21k_tars \
#     IMAGENET2012_MANUAL_DIR=gs://my-bucket/imagenet2012_tars \
#     bash launch/tpu/data.sh paper imagenet21k [--dry-run]
#
# DATASET is one or more of:
#   paper         shorthand for imagenet2012 imagenet_v2 and the 8 few-shot datasets
#                 caltech_birds2011 caltech101 cars196 cifar100 dtd colorectal_histology
#                 oxford_iiit_pet uc_merced (the paper's ImageNet-21k runs also need imagenet21k)
#   imagenet21k   built by `python -m big_vision_relu.data.imagenet21k` from a MANUAL download:
#                 MANUAL_DIR = a directory (gs://... or on worker 0) of the per-synset tars
#                 n*.tar of the fall 2011 release (the unpacked fall11_whole.tar, ~1.3 TB; plan
#                 on hours of work and about twice that space in the bucket)
#   imagenet2012  also a MANUAL download (image-net.org, after accepting its terms):
#                 IMAGENET2012_MANUAL_DIR = a directory (gs://... or on worker 0) holding
#                 ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar
#   NAME          any other TFDS dataset, e.g. cifar100, imagenet_v2 (downloaded by TFDS):
#                 tfds build NAME --data_dir=gs://$BUCKET/tensorflow_datasets --file_format=array_record
# Run launch/tpu/setup.sh first (it installs tfds on the workers). Re-running skips what is
# already prepared (TFDS notices it). Do not start two of these at once on one bucket.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
((${#POSITIONAL[@]} > 0)) || usage_error "name at least one dataset (or: paper)"

PAPER_DATASETS=(imagenet2012 imagenet_v2 caltech_birds2011 caltech101 cars196 cifar100 dtd
                colorectal_histology oxford_iiit_pet uc_merced)
datasets=()
add_dataset() {
  local d
  for d in "${datasets[@]}"; do [[ ${d} == "$1" ]] && return 0; done
  datasets+=("$1")
}
for name in "${POSITIONAL[@]}"; do
  if [[ ${name} == paper ]]; then
    for d in "${PAPER_DATASETS[@]}"; do add_dataset "${d}"; done
  elif [[ ${name} =~ ^[a-z][a-z0-9_]*(/[A-Za-z0-9_.-]+)?(:[0-9]+\.[0-9]+\.[0-9]+)?$ ]]; then
    add_dataset "${name}"
  else
    usage_error "'${name}' is not a TFDS dataset name (e.g. cifar100, imagenet_v2/matched-frequency)"
  fi
done

needed=(TPU_NAME PROJECT ZONE BUCKET)
for d in "${datasets[@]}"; do
  case "${d%%[/:]*}" in
    imagenet21k) needed+=(MANUAL_DIR) ;;
    imagenet2012) needed+=(IMAGENET2012_MANUAL_DIR) ;;
  esac
done
require "${needed[@]}"
need_gcloud

data_dir="$(gcs_data_dir)"
# On worker 0: prep NAME CMD... runs one build; a failed one is reported and the rest go on.
job='failed=""; prep() { d=$1; shift; echo "== $(date -u +%FT%TZ) $d: $*"; if "$@"; then echo "== $(date -u +%FT%TZ) $d: ready"; else echo "== $(date -u +%FT%TZ) $d: FAILED"; failed="$failed $d"; fi; }; '
for d in "${datasets[@]}"; do
  case "${d%%[/:]*}" in
    imagenet21k)
      cmd=(.venv/bin/python -m big_vision_relu.data.imagenet21k "--manual_dir=${MANUAL_DIR}"
           "--data_dir=${data_dir}") ;;
    imagenet2012)
      cmd=(.venv/bin/tfds build "${d}" "--data_dir=${data_dir}" --file_format=array_record
           "--manual_dir=${IMAGENET2012_MANUAL_DIR}") ;;
    *)
      cmd=(.venv/bin/tfds build "${d}" "--data_dir=${data_dir}" --file_format=array_record) ;;
  esac
  job+="prep $(shell_quote "${d}" "${cmd[@]}"); "
done
job+="if [ -z \"\$failed\" ]; then echo \"== data.sh: done, all in ${data_dir}\"; else echo \"== data.sh: FAILED:\$failed\"; fi"

remote_command="set -e; mkdir -p ~/logs; cd ${REMOTE_DIR}; if [ ! -x .venv/bin/tfds ]; then echo \"\$(hostname): no ${REMOTE_DIR}/.venv, run launch/tpu/setup.sh first\" >&2; exit 1; fi; ( trap \"\" HUP; ${job} ) >> ~/logs/data.log 2>&1 < /dev/null & echo \"\$(hostname): preparing ${datasets[*]} in the background; follow: bash launch/tpu/logs.sh data\""
tpu_ssh 0 "${remote_command}"
