#!/usr/bin/env bash
# A study (big_vision_relu.experiments.study) in the background, resumable: PLAN is a unit of
# big_vision_relu/experiments/studies/ (fmnist: the Fashion-MNIST study, docs/reproduction.md;
# repro: the MNIST-5k one; alpha_length: docs/alpha_length.md, and its controls (a) and (b),
# alpha_length_controls). Re-run the same command to resume after a stop, a reboot or on a
# fresh checkout.
#
#   bash launch/study.sh fmnist              # start / resume in the background
#   bash launch/study.sh fmnist status       # per-phase progress; started runs' checkpoint steps;
#                                            # a gated plan's gate: what may train now, and why
#   bash launch/study.sh fmnist park         # packs the unarchived runs' newest checkpoints into
#                                            # ARCHIVE/parked; the study trains on
#   bash launch/study.sh fmnist stop         # trainers checkpoint and exit; waits for it, then
#                                            # parks as 'park' does
#   bash launch/study.sh fmnist report       # tables, figures, verdicts -> the study's docs
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
PY=.venv/bin/python
if [ ! -x "$PY" ]; then
  "${PYTHON:-python3}" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e .
fi
usage() {
  plans="$("$PY" -c 'from big_vision_relu.experiments import plans; print("|".join(plans.names()))')"
  echo "usage: bash launch/study.sh $plans [start|status|park|stop|report]" >&2
  exit 2
}
[ -n "$PLAN" ] || usage
ROOT="${ROOT:-workdirs/$PLAN}"
ARCHIVE="${ARCHIVE:-results/$PLAN}"
STUDY=("$PY" -m big_vision_relu.experiments.study --plan "$PLAN" --root "$ROOT"
       --archive "$ARCHIVE")
# The plan's DATASETS, DATA_PACKAGES (the Debian packages with their files) and PINNED.
settings="$("${STUDY[@]}" --settings)" || usage
eval "$settings"
PIN=()
if [ "$PINNED" = true ]; then
  if [ -f "$ARCHIVE/study.json" ]; then
    COMMIT="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["commit"])' \
      "$ARCHIVE/study.json")"
  fi
  PIN=(--commit "${COMMIT:-$(git rev-parse HEAD)}")
fi
mkdir -p "$ROOT"
case "${2:-start}" in
  start)
    if [ -f "$ROOT/study.lock" ] && ! flock -n "$ROOT/study.lock" true; then
      echo "the study is already running as pid $(cat "$ROOT/study.lock") (log: $ROOT/study.log)"
      exit 0
    fi
    # The trainers' malloc (study.py) and the datasets' files.
    read -r -a packages <<< "$DATA_PACKAGES"
    bash launch/system_packages.sh libtcmalloc-minimal4 "${packages[@]}"
    "$PY" -m big_vision_relu.data.prepare --datasets "$DATASETS"
    # A machine-wide setting, so the study only says it: huge pages for the trainers' heap.
    thp="$("$PY" -c 'from big_vision_relu.experiments import provenance
print(provenance.transparent_hugepages())')"
    if [ "$thp" = madvise ] || [ "$thp" = never ]; then
      echo "transparent huge pages are '$thp': with 'always' the trainers run 1.06x faster," \
        "same results (docs/benchmarks.md section 3); as root:" \
        "echo always > /sys/kernel/mm/transparent_hugepage/enabled"
    fi
    # The study trains only the phases its plan's rules let train now (its log says which).
    nohup "${STUDY[@]}" "${PIN[@]}" >> "$ROOT/study.log" 2>&1 &
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
    # The plan's figures' tables and figures, then its own report (verdicts), into DOCS
    # (default: the plan's docs directory).
    "$PY" -m big_vision_relu.experiments.report --plan "$PLAN" --root "$ARCHIVE" \
      ${DOCS:+--out "$DOCS"}
    ;;
  *)
    usage
    ;;
esac
