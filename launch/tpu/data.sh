#!/usr/bin/env bash
# Prepares TFDS datasets (ArrayRecord, as the input pipeline needs) into
# gs://$BUCKET/tensorflow_datasets, once per bucket, on a CPU VM that it creates and deletes
# when done (also when a step fails or on Ctrl-C). Never touches the TPU.
#
#   PROJECT=my-project ZONE=europe-west4-a BUCKET=my-bucket \
#     MANUAL_DIR=gs://my-bucket/imagenet21k_winter2021_tars \
#     IMAGENET2012_MANUAL_DIR=gs://my-bucket/imagenet2012_tars \
#     CARS196_MANUAL_DIR=gs://my-bucket/cars196_files \
#     bash launch/tpu/data.sh paper imagenet21k/winter2021 [--dry-run]
#
# DATASET is one or more of:
#   paper         shorthand for imagenet2012 imagenet_v2 and the 8 few-shot datasets
#                 caltech_birds2011 caltech101 cars196 cifar100 dtd colorectal_histology
#                 oxford_iiit_pet uc_merced (the paper's ImageNet-21k runs also need imagenet21k)
#   imagenet21k/winter2021  from a MANUAL download, the release image-net.org offers today:
#                 MANUAL_DIR = the per-synset tars n*.tar of winter21_whole.tar.gz (unpacked,
#                 ~1.2 TB); train on it with configs/vit_i21k.py:...,release=winter2021
#   imagenet21k/fall2011  the paper's release (= TFDS's `imagenet21k`, what configs/paper/*.py
#                 train on), for those who have fall11_whole.tar: MANUAL_DIR = its n*.tar
#                 Both are built by `python -m big_vision_relu.data.imagenet21k --release=R`
#                 (one process: about a day); plain `imagenet21k` is refused: name the release.
#   imagenet2012  MANUAL too (image-net.org, after accepting its terms): IMAGENET2012_MANUAL_DIR
#                 holds ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar
#   cars196       MANUAL (its download has been gone since 2023): CARS196_MANUAL_DIR holds
#                 its 4 files, checked by size and sha256 before the build; which files and
#                 where to get them: python -m big_vision_relu.data.prepare --datasets=cars196
#   caltech_birds2011  downloaded by TFDS from data.caltech.edu, or, when
#                 CALTECH_BIRDS2011_MANUAL_DIR is set, from CUB_200_2011.tgz and
#                 segmentations.tgz there (sha256 checked the same way)
#   NAME          any other TFDS dataset, e.g. cifar100, imagenet_v2 (downloaded by TFDS;
#                 NAME_MANUAL_DIR, upper case, if set, is passed as its --manual_dir)
# Every one but imagenet21k is built by `python -m big_vision_relu.data.prepare --download`.
#
# Steps (each gcloud line is printed; --dry-run prints them only):
#   1. gcloud compute instances create $DATA_VM --machine-type=$DATA_MACHINE_TYPE
#        --boot-disk-size=${DATA_DISK_GB}GB --scopes=storage-rw --max-run-duration=...
#        --instance-termination-action=DELETE ...  (Debian 12; storage-rw: writes the bucket)
#   2. gcloud compute scp/ssh: this tree, a venv, `pip install -e .`, a test write to
#      gs://$BUCKET/tensorflow_datasets (fails here, in minutes, if the VM may not write it)
#   3. gcloud compute ssh: every dataset built at once, one process each (detached on the VM,
#      logs ~/logs/data/NAME.log); this script follows ~/logs/data.log until all have ended.
#      Every DATA_PROGRESS_SECONDS (600) data.log gets each running build's newest progress line
#      (examples done, rate, ETA: TFDS's progress bar, or imagenet21k's own line);
#      `bash launch/tpu/status.sh --data` shows the newest line of each dataset from anywhere.
#   4. gcloud compute instances delete $DATA_VM --quiet  (a trap: also after a failure)
# Keep this shell alive (tmux/screen) until it ends: if it dies, the VM still deletes itself
# after DATA_MAX_HOURS (default 72). Re-running skips what is already prepared.
# Machine (launch/tpu/README.md says why, and the cost): DATA_MACHINE_TYPE (n2-standard-32),
# DATA_DISK_GB (2000), DATA_VM (relu-vit-data); DATA_SERVICE_ACCOUNT to run as another service
# account than the project's Compute Engine default one.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
parse_args "$@"
((${#POSITIONAL[@]} > 0)) || usage_error "name at least one dataset (or: paper)"

DATA_VM="${DATA_VM:-relu-vit-data}"
DATA_MACHINE_TYPE="${DATA_MACHINE_TYPE:-n2-standard-32}"
DATA_DISK_GB="${DATA_DISK_GB:-2000}"
DATA_MAX_HOURS="${DATA_MAX_HOURS:-72}"
DATA_PROGRESS_SECONDS="${DATA_PROGRESS_SECONDS:-600}"
DATA_SERVICE_ACCOUNT="${DATA_SERVICE_ACCOUNT:-}"
CALTECH_BIRDS2011_MANUAL_DIR="${CALTECH_BIRDS2011_MANUAL_DIR:-}"

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
  elif [[ ${name%%:*} == imagenet21k ]]; then
    usage_error "'${name}': name the ImageNet-21k release: imagenet21k/winter2021 (the one image-net.org offers today) or imagenet21k/fall2011 (the paper's, fall11_whole.tar)"
  elif [[ ${name} == imagenet21k/* && ! ${name%%:*} =~ ^imagenet21k/(winter2021|fall2011)$ ]]; then
    usage_error "'${name}': the ImageNet-21k releases are imagenet21k/winter2021 and imagenet21k/fall2011"
  elif [[ ${name} =~ ^[a-z][a-z0-9_]*(/[A-Za-z0-9_.-]+)?(:[0-9]+\.[0-9]+\.[0-9]+)?$ ]]; then
    add_dataset "${name}"
  else
    usage_error "'${name}' is not a TFDS dataset name (e.g. cifar100, imagenet_v2/matched-frequency)"
  fi
done

needed=(PROJECT ZONE BUCKET)
for d in "${datasets[@]}"; do
  case "${d%%[/:]*}" in
    imagenet21k) needed+=(MANUAL_DIR) ;;
    imagenet2012) needed+=(IMAGENET2012_MANUAL_DIR) ;;
    cars196) needed+=(CARS196_MANUAL_DIR) ;;
  esac
done
require "${needed[@]}"
for var in DATA_VM DATA_MACHINE_TYPE DATA_DISK_GB DATA_MAX_HOURS DATA_PROGRESS_SECONDS; do
  validate_var "${var}"
done
need_gcloud

data_dir="$(gcs_data_dir)"
downloads=tfds_downloads  # TFDS's downloads and extracted archives: on the VM's disk
# One build per dataset, all in the background at once (one core each; the VM has many).
# prep NAME LOG CMD...: logs to ~/logs/data/LOG.log, its outcome to data.log; a failure does not
# stop the others; the job's exit status (in ~/logs/data.rc) says whether any failed.
# progress: every DATA_PROGRESS_SECONDS, the newest progress line of each build still running
# (TFDS's bar rewrites its line with a carriage return; imagenet21k logs "... progress: ...").
job='prep() { d=$1; f=$2; shift 2; echo "== $(date -u +%FT%TZ) $d: started: $*"; if "$@" > ~/logs/data/$f.log 2>&1; then echo "== $(date -u +%FT%TZ) $d: ready"; else echo "== $(date -u +%FT%TZ) $d: FAILED, the end of ~/logs/data/$f.log:"; tail -n 20 ~/logs/data/$f.log | sed "s/^/   $d| /"; touch ~/logs/data/$f.failed; fi; touch ~/logs/data/$f.ended; }; '
job+="progress() { while sleep ${DATA_PROGRESS_SECONDS}; do for log in ~/logs/data/*.log; do f=\${log##*/}; f=\${f%.log}; [ -e ~/logs/data/\$f.ended ] && continue; line=\$(tail -c 65536 \"\$log\" | tr '\\r' '\\n' | grep -E 'examples/s|progress: ' | tail -n 1 | sed 's/^ *//; s/ *\$//'); [ -n \"\$line\" ] && echo \"== \$(date -u +%FT%TZ) \$f: progress: \$line\"; done; done; }; progress & progress_pid=\$!; pids=; "
for d in "${datasets[@]}"; do
  base="${d%%[/:]*}"
  manual_var="${base^^}_MANUAL_DIR"
  log_name="${d//[\/:]/_}"  # imagenet21k/winter2021 -> imagenet21k_winter2021
  if [[ ${base} == imagenet21k ]]; then
    release="${d#imagenet21k/}"
    cmd=(.venv/bin/python -m big_vision_relu.data.imagenet21k "--release=${release%%:*}"
         "--manual_dir=${MANUAL_DIR}" "--data_dir=${data_dir}")
  else
    # Our prepare CLI, not `tfds build` (TFDS 4.9's CLI needs apache-beam just to start): it
    # checks cars196's and caltech_birds2011's hand-fetched files, builds ArrayRecord.
    cmd=(.venv/bin/python -m big_vision_relu.data.prepare --download "--datasets=${d}"
         "--data_dir=${data_dir}" "--download_dir=${downloads}")
    if [[ -n ${!manual_var-} ]]; then  # e.g. IMAGENET2012_MANUAL_DIR (required above)
      cmd+=("--manual_dir=${!manual_var}")
    fi
  fi
  job+="prep $(shell_quote "${d}" "${log_name}" "${cmd[@]}") & pids=\"\$pids \$!\"; "
done
job+="wait \$pids; kill \$progress_pid; failed=\$(cd ~/logs/data && ls -- *.failed 2> /dev/null | sed 's/[.]failed\$//' | tr '\\n' ' '); if [ -z \"\$failed\" ]; then echo \"== data.sh: done, all in ${data_dir}\"; else echo \"== data.sh: FAILED: \$failed\"; exit 1; fi"

probe="${data_dir}/.data_sh_write_test"
setup_steps=(
  'set -e'
  "mkdir -p ${REMOTE_DIR} ~/logs/data ~/tmp"
  "cd ${REMOTE_DIR}"
  'tar -xzf ~/big_vision_relu.tar.gz'
  'rm -f ~/big_vision_relu.tar.gz'
  'if [ ! -x .venv/bin/python ]; then sudo apt-get -qq -o DPkg::Lock::Timeout=600 update; sudo DEBIAN_FRONTEND=noninteractive apt-get -qq -o DPkg::Lock::Timeout=600 install -y python3-venv > /dev/null; python3 -m venv .venv; fi'
  '.venv/bin/python -m pip install -q --upgrade pip'
  '.venv/bin/python -m pip install -q -e .'
  # TF's GCS writer needs the VM's storage-rw scope and the account's write permission.
  "if ! .venv/bin/python -c 'import sys, tensorflow as tf; f = tf.io.gfile.GFile(sys.argv[1], \"w\"); f.write(\"ok\"); f.close(); tf.io.gfile.remove(sys.argv[1])' $(shell_quote "${probe}"); then echo \"\$(hostname): cannot write ${probe}: give the VM's service account roles/storage.objectAdmin on gs://${BUCKET} (or set DATA_SERVICE_ACCOUNT to one that has it)\" >&2; exit 1; fi"
  'echo "$(hostname): ready, writes to '"${data_dir}"' work"'
)
setup_command="$(printf '%s; ' "${setup_steps[@]}")"
setup_command="${setup_command%; }"
# TMPDIR: TF's GCS writer stages each object on local disk until it is closed (TFDS's shuffle
# buckets of imagenet21k, ~1.3 TB, among them): the big boot disk, never a tmpfs /tmp.
start_command="set -e; cd ${REMOTE_DIR}; rm -f ~/logs/data/*.failed ~/logs/data/*.ended ~/logs/data.rc; export TMPDIR=\$HOME/tmp; ( trap \"\" HUP; set +e; ( ${job} ); echo \$? > ~/logs/data.rc ) >> ~/logs/data.log 2>&1 < /dev/null & echo \$! > ~/logs/data.pid; echo \"\$(hostname): preparing ${datasets[*]}\""
# Ends when the job has: the log so far, then its exit status (255 would be ssh's own).
follow_command="tail -n +1 -F --pid=\$(cat ~/logs/data.pid) ~/logs/data.log 2> /dev/null; exit \$(cat ~/logs/data.rc 2> /dev/null || echo 254)"

create=(gcloud compute instances create "${DATA_VM}" "--zone=${ZONE}" "--project=${PROJECT}"
        "--machine-type=${DATA_MACHINE_TYPE}" "--boot-disk-size=${DATA_DISK_GB}GB"
        --boot-disk-type=pd-balanced --image-family=debian-12 --image-project=debian-cloud
        --scopes=storage-rw "--max-run-duration=${DATA_MAX_HOURS}h"
        --instance-termination-action=DELETE)
if [[ -n ${DATA_SERVICE_ACCOUNT} ]]; then create+=("--service-account=${DATA_SERVICE_ACCOUNT}"); fi

delete_vm() {
  trap - EXIT
  run_cmd gcloud compute instances delete "${DATA_VM}" "--zone=${ZONE}" "--project=${PROJECT}" \
    --quiet || echo "warning: could not delete the VM; delete it with: gcloud compute instances delete ${DATA_VM} --zone=${ZONE} --project=${PROJECT}" >&2
}

# A VM of that name that already exists makes `create` fail before the trap is set: it may be
# another data.sh's, so this one never deletes it.
run_cmd "${create[@]}"
trap delete_vm EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP
note "${DATA_VM}: ${DATA_MACHINE_TYPE}, ${DATA_DISK_GB} GB disk; deleted when this script ends, at the latest after ${DATA_MAX_HOURS} h"

tarball="${TMPDIR:-/tmp}/big_vision_relu-${DATA_VM}.tar.gz"
pack_repo "${tarball}"
# A new VM's sshd needs a little while; retried for up to ~5 minutes.
for attempt in {1..20}; do
  if vm_ssh true; then break; fi
  ((attempt < 20)) || die "cannot ssh into ${DATA_VM}"
  sleep 15
done
vm_scp "${tarball}" big_vision_relu.tar.gz
run_cmd rm -f "${tarball}"
vm_ssh "${setup_command}"
vm_ssh "${start_command}"

# Follow until the job ends; a dropped connection (ssh's 255) re-attaches, 10 times at most.
for attempt in {1..10}; do
  status=0
  vm_ssh "${follow_command}" || status=$?
  [[ ${DRY_RUN} == 1 || ${status} != 255 ]] && break
  echo "ssh to ${DATA_VM} dropped; re-attaching in 30 s (${attempt}/10)" >&2
  sleep 30
done
((status == 0)) || die "data.sh on ${DATA_VM} ended with status ${status}: see the FAILED lines above (the VM is deleted now; re-running skips the ready datasets)"
note "Prepared in ${data_dir}: ${datasets[*]}"
