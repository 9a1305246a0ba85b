#!/usr/bin/env bash
# Installs the Debian packages named as arguments that are missing (as root, with apt-get), or,
# without root, fails with the command that installs them.
#   bash launch/system_packages.sh dataset-fashion-mnist libtcmalloc-minimal4
set -euo pipefail
missing=()
for package in "$@"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
[ "${#missing[@]}" = 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "Missing Debian packages; as root: apt-get install ${missing[*]}" >&2
  exit 1
fi
apt-get update -q && apt-get install -y -q "${missing[@]}"
