#!/usr/bin/env bash
# The miniature reproduction on MNIST-5k (docs/reproduction.md): every run of
# configs/repro/fig1..4.py, in the background, resumable (finished: 250 runs in results/repro).
#
#   bash launch/repro.sh [start|status|stop|report]     # = bash launch/study.sh repro ...
set -euo pipefail
exec bash "$(dirname "$0")/study.sh" repro "$@"
