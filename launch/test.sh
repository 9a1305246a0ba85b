#!/usr/bin/env bash
# Runs the whole test suite, installing what it needs first.
#   bash launch/test.sh            # all tests
#   bash launch/test.sh -k attention   # extra arguments go to pytest
# Creates .venv/ (Python >= 3.11) on first use and installs this package with its [dev] extra,
# and (as root) the Debian packages the tests use: Fashion-MNIST's IDX files, so its builder is
# tested on the real files, and the study trainers' malloc (tcmalloc).
# TEST_WORKERS (default 2) pytest-xdist workers, one test file each at a time: most tests use
# one core (compilation), so on 2 cores the suite takes ~2/3 of its serial time.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/system_packages.sh dataset-fashion-mnist libtcmalloc-minimal4
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[dev]'
export TF_CPP_MIN_LOG_LEVEL=3 TF_ENABLE_ONEDNN_OPTS=0
exec .venv/bin/python -m pytest -q --durations=20 --numprocesses="${TEST_WORKERS:-2}" \
  --dist=loadfile "$@"
