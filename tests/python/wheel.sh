#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The wheel (ctest "wheel", issue #29): built from this build tree by scripts/wheel.py, installed
# with `pip install --no-index` into a fresh venv, then, in a mount namespace where the build tree,
# the source tree and the system's copies of every bundled library are covered (empty), with
# LD_LIBRARY_PATH and PYTHONPATH empty:
#   - `memsnap stats FILE` through the venv's command prints what the build's program prints;
#   - `memsnap run` preloads the wheel's interposer into a program;
#   - ldd finds every library of every ELF file of the installed package inside it or on the
#     allowed list (scripts/wheel.py ALLOWED), and no RUNPATH names a directory outside it;
#   - the package imports from the venv and answers (load, top, view, an Error).
# usage: wheel.sh SOURCE_DIR BUILD_DIR [FIXTURE_DIR]   Exit 77 (ctest: skipped) without the tools.
set -euo pipefail
src=$(cd "${1:?usage: wheel.sh SOURCE_DIR BUILD_DIR [FIXTURE_DIR]}" && pwd)
build=$(cd "${2:?}" && pwd)
fixtures=${MEMSNAP_TORCH_FIXTURES:-${3:-}}
for t in python3 patchelf ldd; do
  command -v $t >/dev/null || { echo "SKIP: $t not found (scripts/deps.sh test installs it); wheel test not run"; exit 77; }
done
python3 -c 'import ensurepip' 2>/dev/null || { echo "SKIP: python3-venv not installed; wheel test not run"; exit 77; }
work=$(mktemp -d -t memsnap-wheel.XXXXXX) # (outside the build tree, which is hidden below)
trap 'rm -rf "$work"' EXIT

snap="$src/tests/fuzz/corpus/fuzz_msgpack/small.msgpack"
if [[ -n "$fixtures" && -f "$fixtures/a0kuma_adamw_small.pickle" ]]; then
  snap="$work/fixture.pickle"; cp "$fixtures/a0kuma_adamw_small.pickle" "$snap" # read only outside the build
else
  echo "SKIP: no PyTorch fixtures (MEMSNAP_TORCH_FIXTURES); the wheel is tested on $snap"
fi

python3 "$src/scripts/wheel.py" "$build" "$work/dist"
python3 -m venv "$work/env"
"$work/env/bin/pip" install -q --no-index --disable-pip-version-check "$work"/dist/memsnap-*-py3-none-linux_x86_64.whl
pkg=$("$work/env/bin/python" -c 'import memsnap, os; print(os.path.dirname(memsnap.__file__))')
[[ "$pkg" == "$work/env/"* ]] || { echo "FAIL: memsnap imported from $pkg, not the venv"; exit 1; }
"$build/bin/memsnap" stats "$snap" >"$work/expected.txt"

# lddcheck.sh DIR FILE...: every library of every ELF FILE is in DIR or on the allowed list, and
# every RUNPATH is $ORIGIN-relative; prints the number of ELF files; exit 1 naming a violation
allowed=" $(cd "$src/scripts" && python3 -c 'import wheel; print(" ".join(sorted(wheel.ALLOWED)))') "
cat >"$work/lddcheck.sh" <<LDD
dir=\$1; shift; n=0
for f in "\$@"; do
  [[ "\$(head -c4 "\$f" | od -An -c | tr -d ' ')" == '177ELF' ]] || continue
  n=\$((n + 1))
  while read -r line; do
    so=\${line%% *}; so=\${so##*/}
    case "\$line" in
      *"not found"*) echo "FAIL: \$f: \$line" >&2; exit 1 ;;
      "statically linked") ;;
      *" => \$dir/"*) ;;
      *) [[ "$allowed" == *" \$so "* ]] || { echo "FAIL: \$f needs \$line (outside the wheel, not allowed)" >&2; exit 1; } ;;
    esac
  done < <(ldd "\$f" | sed 's/^[[:space:]]*//; s/ (0x[0-9a-f]*)//')
  rp=\$(patchelf --print-rpath "\$f")
  [[ -z "\$rp" || "\$rp" == '\$ORIGIN' || "\$rp" == '\$ORIGIN/../lib' ]] || { echo "FAIL: \$f has RUNPATH \$rp" >&2; exit 1; }
done
echo \$n
LDD
# the check can fail: on the build's own program, and on the system's libxml2 (which needs ICU)
sysxml=$(ldd "$build/bin/memsnap" | sed -n 's/.*libxml2.so.2 => \([^ ]*\).*/\1/p')
for f in "$build/bin/memsnap" $sysxml; do
  if bash "$work/lddcheck.sh" "$pkg" "$f" >/dev/null 2>"$work/ldd-neg.txt"; then
    echo "FAIL: lddcheck.sh accepts $f, which uses libraries outside the wheel"; exit 1
  fi
  echo "ok: the ldd check refuses $(cut -c7-160 "$work/ldd-neg.txt")"
done

# the checks, run where nothing but the venv can be found
cat >"$work/check.sh" <<CHECK
set -euo pipefail
export LD_LIBRARY_PATH= PYTHONPATH= MEMSNAP_PREFIX=
unset LD_LIBRARY_PATH PYTHONPATH MEMSNAP_PREFIX
cd "$work"
"$work/env/bin/memsnap" stats "$snap" >"$work/got.txt"
cmp "$work/expected.txt" "$work/got.txt" || { echo "FAIL: memsnap stats through the venv differs"; exit 1; }
echo "ok: memsnap stats through \$(command -v "$work/env/bin/memsnap")"
# memsnap run finds the bundled interposer next to the program, and it loads (its libraries too)
"$work/env/bin/memsnap" run --quiet -- grep -o '/[^ ]*libmemsnap_preload.so' /proc/self/maps >"$work/maps.txt" 2>"$work/run.err"
grep -q "^$pkg/lib/libmemsnap_preload.so\$" "$work/maps.txt" && ! grep -q 'ld.so' "$work/run.err" ||
  { echo "FAIL: memsnap run did not preload the wheel's interposer"; cat "$work/maps.txt" "$work/run.err"; exit 1; }
echo "ok: memsnap run preloads \$(head -1 "$work/maps.txt")"
n=\$(find "$pkg" -type f -print0 | xargs -0 bash "$work/lddcheck.sh" "$pkg")
[[ \$n -ge 4 ]] || { echo "FAIL: only \$n ELF files in the installed package"; exit 1; }
echo "ok: ldd: \$n ELF files resolve inside the wheel or to the allowed system libraries"
"$work/env/bin/python" - "$snap" <<'PY'
import os, sys, memsnap
s = memsnap.load(sys.argv[1], check=True)
top = s.top(n=3)
assert top["groups"] and top["total_bytes"] > 0, top
view = s.view()
assert b"memsnapView" in view.page and "srcdoc=" in view._repr_html_()
try:
    memsnap.load(open(sys.argv[1], "rb").read()[:100])
    raise SystemExit("FAIL: truncated bytes were accepted")
except memsnap.Error as e:
    assert "<bytes>" in str(e), e
print("ok: import memsnap", memsnap.__version__, "from", os.path.dirname(memsnap.__file__),
      "; top:", top["total_bytes"], "bytes; view:", len(view.page), "bytes")
PY
CHECK

# cover the build tree, the source tree's package and the system's copies of the bundled libraries
hide=("$build" "$src/python")
for so in "$pkg"/lib/*-????????.so*; do
  orig=$(basename "$so" | sed -E 's/-[0-9a-f]{8}(\.so)/\1/')
  for d in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu; do [[ -e "$d/$orig" ]] && hide+=("$(realpath "$d/$orig")"); done
done
if unshare --mount true 2>/dev/null; then
  { echo 'set -e'; for h in "${hide[@]}"; do
      if [[ -d "$h" ]]; then echo "mount -t tmpfs none '$h'"; else echo "mount --bind /dev/null '$h'"; fi
    done; echo "bash '$work/check.sh'"; } >"$work/ns.sh"
  unshare --mount --propagation private bash "$work/ns.sh"
  echo "ok: with ${#hide[@]} paths covered: the build tree, python/ and the system's $(ls "$pkg"/lib/*-????????.so* | wc -l) bundled libraries"
else
  echo "SKIP: no mount namespace (needs root): the build tree and system libraries stay reachable; checks run with LD_LIBRARY_PATH and PYTHONPATH empty only"
  bash "$work/check.sh"
fi
echo "ok: wheel $(basename "$work"/dist/*.whl), $(du -k "$work"/dist/*.whl | cut -f1) KiB"
