#!/usr/bin/env bash
# A study (big_vision_relu.experiments.study) in the background, resumable: the Fashion-MNIST
# study (docs/reproduction.md), the MNIST-5k one, or the alpha-length one (docs/alpha_length.md). Re-run the same command to resume after a
# stop, a reboot or on a fresh checkout.
#
#   bash launch/study.sh fmnist              # start / resume in the background
#   bash launch/study.sh fmnist status       # per-phase progress; started runs' checkpoint steps
#   bash launch/study.sh fmnist park         # copies the unarchived runs' newest checkpoints to
#                                            # ARCHIVE/parked; the study trains on
#   bash launch/study.sh fmnist stop         # trainers checkpoint and exit; waits for it, then
#                                            # parks as 'park' does
#   bash launch/study.sh fmnist report       # tables, figures, verdicts -> docs/fmnist/
#                                            # (alpha_length: results.md, figures -> docs/alpha_length/)
#
# ROOT (default workdirs/<plan>) holds the runs' workdirs (checkpoints), ROOT/study.log and, for
# a pinned study, ROOT/code: a git worktree at the study's commit, which the trainers run from.
# ARCHIVE (default results/<plan>, committed) keeps every done run, study.json, the pinned
# commit (the first start pins COMMIT, default HEAD; later starts use the recorded one), and
# parked/: the newest checkpoints of runs not yet archived, from which a start on any machine
# resumes (or archives) them (commit ARCHIVE after a park or a stop: a session's machine may
# not outlive it).
set -euo pipefail
cd "$(dirname "$0")/.."
PLAN="${1:-}"
# Per plan: the datasets its runs read, the Debian packages that hold their files, its sweep
# files and where its report goes.
case "$PLAN" in
  fmnist) DATASETS=mnist5k,digits,fashion_mnist_local DATA_PACKAGES=dataset-fashion-mnist
          SWEEP_DIR=configs/study DOCS=docs/fmnist ;;
  repro) DATASETS=mnist5k,digits DATA_PACKAGES='' SWEEP_DIR=configs/repro DOCS=docs/reproduction ;;
  alpha_length) DATASETS=mnist5k,digits,fashion_mnist_local DATA_PACKAGES=dataset-fashion-mnist
                SWEEP_DIR=configs/alpha_length DOCS=docs/alpha_length ;;
  *) echo "usage: bash launch/study.sh fmnist|repro|alpha_length [start|status|park|stop|report]" >&2
     exit 2 ;;
esac
ROOT="${ROOT:-workdirs/$PLAN}"
ARCHIVE="${ARCHIVE:-results/$PLAN}"
PY=.venv/bin/python
if [ ! -x "$PY" ]; then
  "${PYTHON:-python3}" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e .
fi
PIN=()
if [ "$PLAN" != repro ]; then  # the MNIST-5k study finished before studies were pinned
  if [ -f "$ARCHIVE/study.json" ]; then
    COMMIT="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["commit"])' \
      "$ARCHIVE/study.json")"
  fi
  PIN=(--commit "${COMMIT:-$(git rev-parse HEAD)}")
fi
STUDY=("$PY" -m big_vision_relu.experiments.study --plan "$PLAN" --root "$ROOT"
       --archive "$ARCHIVE")
mkdir -p "$ROOT"
case "${2:-start}" in
  start)
    if [ -f "$ROOT/study.lock" ] && ! flock -n "$ROOT/study.lock" true; then
      echo "the study is already running as pid $(cat "$ROOT/study.lock") (log: $ROOT/study.log)"
      exit 0
    fi
    # The trainers' malloc (study.py) and the datasets' files.
    bash launch/system_packages.sh libtcmalloc-minimal4 $DATA_PACKAGES
    "$PY" -m big_vision_relu.data.prepare --datasets "$DATASETS"
    # A machine-wide setting, so the study only says it: huge pages for the trainers' heap.
    thp="$("$PY" -c 'from big_vision_relu.experiments import provenance
print(provenance.transparent_hugepages())')"
    if [ "$thp" = madvise ] || [ "$thp" = never ]; then
      echo "transparent huge pages are '$thp': with 'always' the trainers run 1.06x faster," \
        "same results (docs/benchmarks.md section 3); as root:" \
        "echo always > /sys/kernel/mm/transparent_hugepage/enabled"
    fi
    GATE=()
    if [ "$PLAN" = fmnist ]; then
      # The pre-registered rule: no phase after the calibration until the recipe is accepted.
      status=0
      "$PY" -m big_vision_relu.experiments.fmnist_report --archive "$ARCHIVE" \
        --check_calibration || status=$?
      if [ "$status" = 3 ]; then
        phases="$("$PY" -c 'from big_vision_relu.experiments import fmnist
print(",".join(map(str, fmnist.CALIBRATION_PHASES)))')"
        GATE=(--phases "$phases")
        echo "recipe not accepted (yet): only the calibration phases $phases run"
      elif [ "$status" != 0 ]; then
        exit "$status"
      fi
    fi
    nohup "${STUDY[@]}" "${PIN[@]}" "${GATE[@]}" >> "$ROOT/study.log" 2>&1 &
    echo "study running as pid $! (log: $ROOT/study.log; 'bash launch/study.sh $PLAN status')"
    ;;
  status)
    "${STUDY[@]}" --status
    ;;
  park)
    "${STUDY[@]}" --park
    ;;
  stop)
    # The pid in the lock file is the study's only while the lock is held.
    if [ -f "$ROOT/study.lock" ] && ! flock -n "$ROOT/study.lock" true \
        && pid="$(cat "$ROOT/study.lock")" && kill -TERM "$pid" 2>/dev/null; then
      echo "asked study $pid to stop; trainers checkpoint and exit"
      # Return once it has (the lock is released last), so a 'start' right after resumes.
      if flock -w 300 "$ROOT/study.lock" true; then
        echo "study stopped"
      else
        echo "study $pid still running after 300 s; see $ROOT/study.log" >&2
        exit 1
      fi
    else
      echo "no study running"
    fi
    # So that the next start, on any machine, resumes them: commit ARCHIVE with the rest.
    "${STUDY[@]}" --park
    ;;
  report)
    if [ "$PLAN" = alpha_length ]; then
      exec "$PY" -m big_vision_relu.experiments.alpha_length_report --archive "$ARCHIVE" \
        --out "$DOCS"
    fi
    SWEEPS=()
    for f in "$SWEEP_DIR"/fig[1-4].py; do
      SWEEPS+=(--sweep "$f")
    done
    "$PY" -m big_vision_relu.experiments.report --root "$ARCHIVE" --out "$DOCS" "${SWEEPS[@]}"
    if [ "$PLAN" = fmnist ]; then
      "$PY" -m big_vision_relu.experiments.fmnist_report --archive "$ARCHIVE" --out "$DOCS"
    fi
    ;;
  *)
    echo "usage: bash launch/study.sh fmnist|repro|alpha_length [start|status|park|stop|report]" >&2
    exit 2
    ;;
esac
