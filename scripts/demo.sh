#!/usr/bin/env bash
# memsnap demo (make demo): runs the samples on the simulated device and writes what they produce
# into out/ (MEMSNAP_DEMO_OUT names another folder), one line per step on the terminal, then the
# list of what was made and what to open. A plain sequential list of steps; later steps append
# to it. The build before it (make demo) is quiet: its log is BUILD/build.log.
# usage: scripts/demo.sh BUILD
set -euo pipefail
build=${1:-build}
cd "$(dirname "$0")/.."
out=${MEMSNAP_DEMO_OUT:-out}
mkdir -p "$out"
bin="$build/bin"

# step NAME TEXT: one line per step
step() { printf '  %-8s %s\n' "$1" "$2"; }

"$bin/basic" >"$out/basic.txt"
step basic "$(grep -m1 '^allocated' "$out/basic.txt")"
"$bin/train" --steps 20 >"$out/train-summary.txt"
step train "$(head -n1 "$out/train-summary.txt")"
"$bin/train" --steps 20 --conf max_split_size_mb:64 >"$out/train-summary-max-split-64.txt"
step train "max_split_size_mb:64: $(head -n1 "$out/train-summary-max-split-64.txt" | sed 's/^train: //')"

# allocation history with stacks, snapshots at steps 2 and 5, then a batch too big for the
# device: the OOM observer writes a snapshot
rm -f "$out"/oom-*.msgpack
"$bin/record" "$out" --steps 6 --snapshot-at 2,5 >"$out/record.txt" 2>&1
oom=$(ls "$out"/oom-*-dev0-0.msgpack)
step record "snapshots at steps 2 and 5, then a batch too big: the OOM observer wrote $oom"
"$bin/memsnap" stats "$oom" >"$out/oom-stats.txt"
"$bin/memsnap" memory "$oom" -q -o "$out/oom-memory.svg"
# would expandable segments have avoided it? replayed on the device size the snapshot records
"$bin/memsnap" replay "$oom" --config expandable_segments:True >"$out/oom-replay.txt"
step replay "$(awk 'NR == 1 { match($0, /capacity [^;]*/); cap = substr($0, RSTART, RLENGTH) }
  $1 == "ooms" { rec = $2; now = $3 }
  END { print "the OOM snapshot under expandable_segments:True, " cap ": " now " OOM (recorded: " rec ")" }' \
  "$out/oom-replay.txt")"

# why did it run out, and would a setting have avoided it? every remedy replayed at its capacity
"$bin/memsnap" explain "$oom" >"$out/oom-explain.txt"
step explain "$(awk '$1 == "verdict:" { v = $2; sub(/:$/, "", v) }
  $1 == "recommendation:" { r = $0; sub(/^recommendation: /, "", r); sub(/:.*/, "", r) }
  END { print "the OOM snapshot: " v "; " r " (oom-explain.txt)" }' "$out/oom-explain.txt")"

# memsnap's snapshot commands on the step-5 snapshot, and step 2 vs 5
snap5="$out/step-5.msgpack" snap2="$out/step-2.msgpack"
"$bin/memsnap" stats "$snap5" --summary >"$out/stats.txt"
"$bin/memsnap" trace "$snap5" >"$out/trace.txt"
"$bin/memsnap" memory "$snap5" -q -o "$out/memory.svg"
"$bin/memsnap" segments "$snap5" -q -o "$out/segments.svg"
"$bin/memsnap" compare "$snap2" "$snap5" --at end >"$out/compare.txt"
"$bin/memsnap" compare "$snap2" "$snap5" --segments -q -o "$out/compare.svg" >"$out/compare-segments.txt"
"$bin/memsnap" compare "$snap2" "$snap5" --stacks -q -o "$out/step-2-vs-5.svg"
"$bin/memsnap" view "$snap5" -q -o "$out/view.html"

made() { printf '  %-34s %s\n' "$1" "$2"; }
printf '\nmemsnap demo: made in %s/\n' "$out"
made "basic.txt, train-summary*.txt" "the samples' results and memory_summary() tables"
made "record.txt" "what the record sample did, and where the OOM snapshot went"
made "step-2.msgpack, step-5.msgpack" "snapshots with stacks, for memsnap stats, trace, memory ..."
made "${oom#"$out"/}" "the OOM observer's snapshot (oom-explain.txt, oom-stats.txt, oom-replay.txt)"
made "stats.txt, trace.txt, compare.txt" "memsnap stats --summary, trace and compare (step 2 to 5) as text"
echo "open in a browser:"
made "$out/memory.svg" "what holds memory at step 5: stream, block state, stack"
made "$out/segments.svg" "how the segments are filled at step 5"
made "$out/step-2-vs-5.svg" "what grew between steps 2 and 5 (differential flame graph)"
made "$out/compare.svg" "the segments only in step 2 or only in step 5"
made "$out/oom-memory.svg" "what held memory when the batch did not fit"
made "$out/view.html" "the offline viewer: memory over time, allocator state history"
