#!/bin/sh
# SPDX-License-Identifier: MIT
# The man pages and the bash and zsh completion against --help (issue #32 item 9): the build's
# files are what the generator writes from this memsnap's --help now (no drift); each command's
# option list in its man page, in the bash completion and in the zsh completion equals the one
# its --help prints; every page renders with man without a warning; bash completes a command
# and an option.
#   tests/man/run.sh SRC BUILD
set -eu
src=$1 build=$2
bin=$build/bin/memsnap
work=$(mktemp -d "${TMPDIR:-/tmp}/memsnap-man-XXXXXX")
trap 'rm -rf "$work"' EXIT
python3 "$src/scripts/gen-man-completion.py" "$bin" "$work/share"
diff -r "$work/share" "$build/share" || { echo "FAIL: the build's man pages or completion differ from --help's now"; exit 1; }
fail=0
cmds=$("$bin" --help | awk '/^commands:/ { on = 1; next } on && /^   / { print $1 } on && !/^   / { on = 0 }')
[ "$(echo "$cmds" | wc -l)" -ge 17 ] || { echo "FAIL: too few commands: $cmds"; exit 1; }
# the option names of an option list: lines "  -o, --output OUT  text" (names before the text)
names() { awk '/^options:/ { on = 1; next } on && /^ +-/ && match($0, /^ +/) && RLENGTH <= 4 { sub(/^ +/, ""); sub(/  .*/, "");
  n = split($0, p, ", "); for (i = 1; i <= n; i++) { split(p[i], w, /[ =]/); print w[1] } }' | sort -u; }
for c in $cmds; do
  "$bin" "$c" --help | names >"$work/help"
  # the man page's options: the .TP heads under .SH OPTIONS
  awk '/^\.SH OPTIONS/ { on = 1; next } /^\.SH/ { on = 0 } on && prev == ".TP" { print } { prev = $0 }' \
    "$build/share/man/man1/memsnap-$c.1" | sed 's/\\-/-/g' |
    awk '{ n = split($0, p, ", "); for (i = 1; i <= n; i++) { split(p[i], w, /[ =]/); print w[1] } }' |
    sort -u >"$work/man"
  sed -n "s/^    $c) opts=\"\(.*\)\" ;;\$/\1/p" "$build/share/bash-completion/memsnap" | tr ' ' '\n' |
    sed '/^$/d' | sort -u >"$work/bash"
  sed -n "s/^    $c) opts=(\(.*\)) ;;\$/\1/p" "$build/share/zsh/_memsnap" | tr ' ' '\n' |
    sed '/^$/d' | sort -u >"$work/zsh"
  for kind in man bash zsh; do
    if ! cmp -s "$work/help" "$work/$kind"; then
      echo "FAIL: $c: the $kind options differ from --help's:"; diff "$work/help" "$work/$kind" || true
      fail=1
    fi
  done
  [ -s "$work/help" ] || { echo "FAIL: $c: no options parsed from --help"; fail=1; }
  if command -v man >/dev/null 2>&1; then
    warn=$(MANWIDTH=80 man --warnings -l "$build/share/man/man1/memsnap-$c.1" 2>&1 >/dev/null || true)
    [ -z "$warn" ] || { echo "FAIL: memsnap-$c.1: $warn"; fail=1; }
  fi
done
# bash completes a command and an option
out=$(bash -c ". '$build/share/bash-completion/memsnap'; COMP_WORDS=(memsnap sta); COMP_CWORD=1; _memsnap; echo \"\${COMPREPLY[*]}\"")
[ "$out" = "stats" ] || { echo "FAIL: bash completion of 'memsnap sta': '$out'"; fail=1; }
out=$(bash -c ". '$build/share/bash-completion/memsnap'; COMP_WORDS=(memsnap memory x --fol); COMP_CWORD=3; _memsnap; echo \"\${COMPREPLY[*]}\"")
[ "$out" = "--folded" ] || { echo "FAIL: bash completion of 'memsnap memory x --fol': '$out'"; fail=1; }
[ "$fail" -eq 0 ] || exit 1
echo "PASS: man pages and completion for $(echo "$cmds" | wc -l) commands match --help"
