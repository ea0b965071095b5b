#!/usr/bin/env bash
# call_overhead.py --mechanism (no torch) on other Pythons: builds fxguard._core
# for each in a temporary copy of src/ (gcc, the flags setup.py uses with
# FXGUARD_WERROR=1) and saves results/call_overhead_mechanism/<machine>-py<X.Y.Z>-<date>.json.
#   benchmarks/mechanism_pythons.sh ~/.pyenv/versions/3.1{0,2,3}*/bin/python
set -euo pipefail
cd "$(dirname "$0")/.."
for py in "$@"; do
  ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  tmp=$(mktemp -d)
  cp -r src "$tmp/"
  rm -f "$tmp"/src/fxguard/_core.*.so
  inc=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
  suffix=$("$py" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  gcc -shared -fPIC -O3 -fwrapv -DNDEBUG -std=c11 -Wall -Wextra -Werror -I"$inc" \
      src/fxguard/_core/*.c -o "$tmp/src/fxguard/_core$suffix"
  echo "== Python $ver ($py)"
  PYTHONPATH="$tmp/src" "$py" benchmarks/call_overhead.py --mechanism --save
  rm -rf "$tmp"
done
