#!/usr/bin/env bash
# The miniature reproduction (docs/reproduction.md): every run of configs/repro/fig1..4.py, in
# the background, resumable. Re-run the same command to resume after a stop or a reboot.
#
#   bash launch/repro.sh                      # start / resume in the background
#   bash launch/repro.sh status               # per-phase progress
#   bash launch/repro.sh stop                 # trainers checkpoint and exit; waits for it
#   bash launch/repro.sh report               # tables and figures -> docs/reproduction/
#
# ROOT (default workdirs/repro) holds the runs' workdirs (checkpoints) and ROOT/study.log, the
# study's log; ARCHIVE (default results/repro, committed) keeps the results of every done run,
# so a fresh checkout resumes where the last one stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="${ROOT:-workdirs/repro}"
ARCHIVE="${ARCHIVE:-results/repro}"
PY=.venv/bin/python
if [ ! -x "$PY" ]; then
  "${PYTHON:-python3}" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e .
fi
mkdir -p "$ROOT"
case "${1:-start}" in
  start)
    if [ -f "$ROOT/study.lock" ] && ! flock -n "$ROOT/study.lock" true; then
      echo "the study is already running as pid $(cat "$ROOT/study.lock") (log: $ROOT/study.log)"
      exit 0
    fi
    "$PY" -m big_vision_relu.data.prepare
    nohup "$PY" -m big_vision_relu.study --root "$ROOT" --archive "$ARCHIVE" >> "$ROOT/study.log" 2>&1 &
    echo "study running as pid $! (log: $ROOT/study.log; 'bash launch/repro.sh status')"
    ;;
  status)
    "$PY" -m big_vision_relu.study --root "$ROOT" --archive "$ARCHIVE" --status
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
    ;;
  report)
    "$PY" -m big_vision_relu.report --root "$ARCHIVE" --out docs/reproduction \
      --sweep configs/repro/fig1.py --sweep configs/repro/fig2.py \
      --sweep configs/repro/fig3.py --sweep configs/repro/fig4.py
    ;;
  *)
    echo "usage: bash launch/repro.sh [start|status|stop|report]" >&2
    exit 2
    ;;
esac
