#!/bin/sh
# SPDX-License-Identifier: MIT
# scripts/check-docs.py fails on each kind of development history in a user document, and passes
# PyTorch's issue references and the developer documents.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
script="$here/../../scripts/check-docs.py"
work=$(mktemp -d "${TMPDIR:-/tmp}/memsnap-docs-XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/docs/dev"
cat >"$work/README.md" <<'MD'
Since stop 25 the reads are faster.
Measured against 923d429 on the shared 2-core development VM.
Fixed in issue #18 and #6.
As PyTorch does (PyTorch #123548, PyTorch issue #106660).
MD
echo "stop 3, 923d429, issue #1" >"$work/docs/contributing.md"
echo "stop 3, 923d429, issue #1" >"$work/docs/dev/log.md"
set +e
out=$(python3 "$script" "$work" 2>&1)
rc=$?
set -e
echo "$out"
[ "$rc" -eq 1 ] || { echo "FAIL: exit $rc, expected 1"; exit 1; }
for want in "README.md:1: a development step ('stop N')" "README.md:2: a commit hash" \
            "README.md:2: the development machine" "README.md:3: an issue number"; do
  echo "$out" | grep -qF "$want" || { echo "FAIL: missing: $want"; exit 1; }
done
if echo "$out" | grep -q "README.md:4\|contributing\|dev/log"; then
  echo "FAIL: PyTorch's references or a developer document flagged"; exit 1
fi
echo "PASS"
