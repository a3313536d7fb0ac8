#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Python package's tests against a build tree (ctest "python" and "python_notebook").
# usage: run.sh api|notebook SOURCE_DIR BUILD_DIR [FIXTURE_DIR]
# Debian's python3 (pytest, nbclient, ipykernel are its packages); exit 77 (skipped) without them.
set -euo pipefail
what=${1:?usage: run.sh api|notebook SOURCE_DIR BUILD_DIR [FIXTURE_DIR]}
src=$(cd "${2:?}" && pwd); build=$(cd "${3:?}" && pwd)
export MEMSNAP_TORCH_FIXTURES=${MEMSNAP_TORCH_FIXTURES:-${4:-}}
export MEMSNAP_PREFIX="$build" PYTHONPATH="$src/python" PYDEVD_DISABLE_FILE_VALIDATION=1
py=/usr/bin/python3; [[ -x $py ]] || py=python3
if [[ "$what" == api ]]; then
  $py -c 'import pytest' 2>/dev/null || { echo "SKIP: pytest not found (scripts/deps.sh test installs python3-pytest)"; exit 77; }
  ls "$MEMSNAP_TORCH_FIXTURES"/*.pickle >/dev/null 2>&1 ||
    echo "SKIP: no PyTorch fixtures (MEMSNAP_TORCH_FIXTURES): the per-fixture comparisons do not run"
  exec $py -m pytest -q -p no:cacheprovider -rs "$src/tests/python/test_api.py"
fi
$py -c 'import nbclient, ipykernel' 2>/dev/null || { echo "SKIP: nbclient/ipykernel not found (scripts/deps.sh test installs them)"; exit 77; }
chromium=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[[ -n "$chromium" ]] || { echo "SKIP: chromium not found; notebook test not run"; exit 77; }
snap="$src/tests/fuzz/corpus/fuzz_msgpack/small.msgpack"
if [[ -f "$MEMSNAP_TORCH_FIXTURES/a0kuma_adamw_small.pickle" ]]; then
  snap="$MEMSNAP_TORCH_FIXTURES/a0kuma_adamw_small.pickle"
else
  echo "SKIP: no PyTorch fixtures (MEMSNAP_TORCH_FIXTURES): the notebook shows $snap"
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
$py "$src/tests/python/notebook.py" "$snap" "$work" "$chromium"
