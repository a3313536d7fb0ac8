#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# scripts/check-deps.py and scripts/check-size.py can fail: each case builds a small tree with one broken rule and expects
# exit 1 and the offending include named; a clean tree passes; and the real tree with one include
# pointing up fails, naming it (issue #11).
set -u
root="$(cd "$(dirname "$0")/../.." && pwd)"
check="$root/scripts/check-deps.py"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fails=0

# tree NAME: a minimal tree that follows the rule
tree() {
  local t="$tmp/$1"
  mkdir -p "$t"/lib/{common,alloc,snapshot,replay,export} "$t"/viz/flamegraph "$t"/cli "$t"/include/memsnap
  echo '#include "memsnap/common.h"' >"$t/lib/common/internal.h"
  echo '#include "common/internal.h"' >"$t/lib/alloc/types.h"
  printf '#include "alloc/types.h"\n#include "common/internal.h"\n' >"$t/lib/alloc/allocator.c"
  echo '#include "alloc/types.h"' >"$t/lib/snapshot/take.c"
  echo '' >"$t/lib/snapshot/take.h"
  echo '' >"$t/lib/export/sqlite.h"
  echo '#include "memsnap/common.h"' >"$t/viz/flamegraph/svg.c"
  echo '#include "memsnap/common.h"' >"$t/cli/main.c"
  echo '' >"$t/include/memsnap/common.h"
  echo "$t"
}

# expect NAME RC PATTERN: runs the check on tree NAME, wants exit RC and PATTERN on stderr
expect() {
  local out rc
  out="$(python3 "$check" "$tmp/$1" 2>&1)"
  rc=$?
  if [[ $rc -ne $2 ]] || ! grep -qF -- "$3" <<<"$out"; then
    echo "FAIL $1: exit $rc (want $2), output:"
    echo "$out"
    echo "  (wanted: $3)"
    fails=$((fails + 1))
  else
    echo "ok   $1"
  fi
}

t=$(tree clean)
expect clean 0 "follow the rule"

t=$(tree up)
echo '#include "snapshot/take.h"' >>"$t/lib/alloc/allocator.c"
expect up 1 'lib/alloc/allocator.c:3: #include "snapshot/take.h": points up, from alloc to snapshot'

t=$(tree sibling)
echo '#include "export/sqlite.h"' >"$t/lib/replay/replay.c"
expect sibling 1 'lib/replay/replay.c:1: #include "export/sqlite.h": replay and export are siblings'

t=$(tree private)
echo '#include "common/internal.h"' >>"$t/viz/flamegraph/svg.c"
expect private 1 'viz/flamegraph/svg.c:2: #include "common/internal.h": viz/flamegraph sees only the public headers'

t=$(tree thirdparty)
echo '#include <sqlite3.h>' >>"$t/lib/alloc/allocator.c"
expect thirdparty 1 'lib/alloc/allocator.c:3: #include <sqlite3.h>: third-party header outside lib/export/sqlite.c'

t=$(tree circle)
echo '#include "common/b.h"' >"$t/lib/common/a.h"
echo '#include "common/a.h"' >"$t/lib/common/b.h"
expect circle 1 'circle of includes: lib/common/a -> lib/common/b -> lib/common/a'

t=$(tree missing)
echo '#include "alloc/nowhere.h"' >>"$t/lib/alloc/allocator.c"
expect missing 1 '#include "alloc/nowhere.h": no such file in the tree'

t=$(tree stray)
mkdir -p "$t/lib/misc" && echo '' >"$t/lib/misc/x.c"
expect stray 1 'lib/misc/x.c: in no module of the rule'

# the real tree, with one include pointing up added to the allocator
mkdir -p "$tmp/real"
cp -r "$root"/{lib,viz,cli,include} "$tmp/real/"
[[ -d "$root/samples" ]] && cp -r "$root/samples" "$tmp/real/"
expect real 0 "follow the rule"
n=$(wc -l <"$tmp/real/lib/alloc/allocator.c")
echo '#include "replay/replay.h"' >>"$tmp/real/lib/alloc/allocator.c"
echo '' >"$tmp/real/lib/replay/replay.h"
expect real 1 "lib/alloc/allocator.c:$((n + 1)): #include \"replay/replay.h\": points up, from alloc to replay"

# the size rule: a file over 1,000 lines and a function over 120 lines are named
size="$root/scripts/check-size.py"
mkdir -p "$tmp/size/lib/common"
{ echo "int f(void) {"; for i in $(seq 1 125); do echo "  (void)0;"; done; echo "  return 0;"; echo "}"; } \
  >"$tmp/size/lib/common/long.c"
for i in $(seq 1 1001); do echo "/* line $i */"; done >"$tmp/size/lib/common/big.h"
out="$(python3 "$size" "$tmp/size" 2>&1)"
rc=$?
if [[ $rc -eq 1 ]] && grep -qF "lib/common/long.c:1: f() is 128 lines (the rule: at most 120)" <<<"$out" &&
  grep -qF "lib/common/big.h: 1001 lines (the rule: at most 1000" <<<"$out"; then
  echo "ok   size"
else
  echo "FAIL size: exit $rc, output:"
  echo "$out"
  fails=$((fails + 1))
fi
rm -f "$tmp/size/lib/common/big.h" "$tmp/size/lib/common/long.c"
echo "int g(void) { return 0; }" >"$tmp/size/lib/common/ok.c"
if python3 "$size" "$tmp/size" >/dev/null 2>&1; then echo "ok   size-clean"; else
  echo "FAIL size-clean"
  fails=$((fails + 1))
fi

if [[ $fails -ne 0 ]]; then
  echo "$fails case(s) failed"
  exit 1
fi
echo "all cases passed"
