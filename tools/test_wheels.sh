#!/usr/bin/env bash
# Build fxguard's wheel with each Python given (default: pyenv's 3.10, 3.12,
# 3.13), install it in a fresh venv with pytest, and run the torch-free core
# tests against the installed wheel.  fxguard ships one wheel per CPython
# version (README, "Wheels"): each is built and tested here.
#   tools/test_wheels.sh [python ...]
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 FXGUARD_WERROR=1
pythons=("$@")
[ ${#pythons[@]} -gt 0 ] || pythons=(~/.pyenv/versions/3.10.*/bin/python ~/.pyenv/versions/3.12.*/bin/python ~/.pyenv/versions/3.13.*/bin/python)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp tests/core/test_without_torch.py "$tmp/"
for py in "${pythons[@]}"; do
  version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  echo "== Python $version: build the wheel, install it in a fresh venv, core tests"
  "$py" -m pip wheel -q --no-deps -w "$tmp/dist-$version" .
  wheel=$(ls "$tmp/dist-$version"/fxguard-*.whl)
  "$py" -m venv "$tmp/venv-$version"
  "$tmp/venv-$version/bin/python" -m pip install -q "$wheel" pytest
  (cd "$tmp" && "$tmp/venv-$version/bin/python" -m pytest -q -p no:cacheprovider --noconftest \
     test_without_torch.py)
  vpy="$tmp/venv-$version/bin/python"
  "$vpy" -c 'import fxguard, inspect; print(" ", fxguard.__file__, inspect.signature(fxguard._core.RLock.acquire))'
  # The wheel's .pth is in site-packages and arms the torch import hook.
  FXGUARD=1 "$vpy" -c 'import sys; assert any(type(f).__name__ == "_AfterImportFinder" for f in sys.meta_path)'
  "$tmp/venv-$version/bin/fxguard" run -m json.tool --help >/dev/null
done
