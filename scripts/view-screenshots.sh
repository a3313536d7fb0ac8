#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Makes the screenshots of docs/view.md (docs/images/view-timeline.png, view-history.png) from a
# PyTorch fixture with headless Chromium, so that they show the page as it is built now.
# usage: scripts/view-screenshots.sh [MEMSNAP_BINARY [SNAPSHOT]]
#   MEMSNAP_BINARY defaults to build/bin/memsnap; SNAPSHOT to a0kuma_adamw_small.pickle in
#   $MEMSNAP_TORCH_FIXTURES (the fixtures are never copied into the project).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
memsnap=${1:-$root/build/bin/memsnap}
snap=${2:-${MEMSNAP_TORCH_FIXTURES:?set MEMSNAP_TORCH_FIXTURES or name a snapshot}/a0kuma_adamw_small.pickle}
chromium=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || true)}
[[ -n "$chromium" ]] || { echo "view-screenshots: chromium not found" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$memsnap" view "$snap" -o "$work/page.html" >/dev/null
# shot VIEW FRAGMENT OUT: the page opened at #view=VIEW&FRAGMENT, 1200x700
shot() {
  "$chromium" --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --disable-dev-shm-usage --hide-scrollbars \
    --user-data-dir="$work/profile-$1" --window-size=1200,700 --virtual-time-budget=8000 \
    --screenshot="$3" "file://$work/page.html#view=$1&$2" >/dev/null 2>&1
  [[ -s "$3" ]] || { echo "view-screenshots: no screenshot of $1" >&2; exit 1; }
  echo "view-screenshots: wrote $3"
}
shot timeline "" "$root/docs/images/view-timeline.png"
shot history "" "$root/docs/images/view-history.png"
