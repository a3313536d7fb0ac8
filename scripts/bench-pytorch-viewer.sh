#!/usr/bin/env bash
# Side by side: PyTorch's viewer data computation (process_alloc_data, run under Node) and
# `memsnap timeline FILE --viewer-data --max-entries N` on one PyTorch snapshot pickle (docs/timeline.md,
# "Speed"). PyTorch's code is not part of memsnap: pass the path of your own copy of
# torch/utils/viz/process_alloc_data.js (from a PyTorch checkout).
#
# usage: scripts/bench-pytorch-viewer.sh PROCESS_ALLOC_DATA_JS PICKLE
# env:   MEMSNAP (default build/bin/memsnap), RUNS (5), MAX_ENTRIES (15000), DEVICE (the viewer's
#        default device), NODE_MAX_OLD_SPACE_MB (16384), TMPDIR
# needs: python3, node (>= 18)
#
# What is timed: the pickle is read by python3's pickle module and written as line-delimited JSON
# (not timed). Node reads that back (parse ms: reading, JSON.parse, restoring the frames the pickle
# shares), annotates it as the viewer's annotate_snapshot does (annotate ms), then runs
# process_alloc_data(snapshot, device, false, MAX_ENTRIES) RUNS times (median ms). memsnap is run
# RUNS times after that, wall time of the whole command (pickle reading included, JSON written to
# a file). Then the outputs are checked to agree: max_size, elements_length, the number of
# max_at_time points and, per series, elem and the lengths of timesteps/offsets/size.
set -euo pipefail

js=${1:-}
pickle=${2:-}
if [[ -z "$js" ]]; then
  echo "SKIP: no process_alloc_data.js given (usage: $0 PROCESS_ALLOC_DATA_JS PICKLE); nothing compared"
  exit 0
fi
if [[ ! -f "$js" || -z "$pickle" || ! -f "$pickle" ]]; then
  echo "bench-pytorch-viewer: error: usage: $0 PROCESS_ALLOC_DATA_JS PICKLE (both files must exist)" >&2
  exit 2
fi
for tool in python3 node; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed; nothing compared"; exit 0; }
done
memsnap=${MEMSNAP:-$(dirname "$0")/../build/bin/memsnap}
[[ -x "$memsnap" ]] || { echo "bench-pytorch-viewer: error: $memsnap: not built (make build)" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-pytorch-viewer.XXXXXX")
trap 'rm -rf "$work"' EXIT

# --- Node side: load the line-delimited JSON, annotate, time process_alloc_data -----------------
cat > "$work/run.cjs" <<'NODE'
'use strict';
const fs = require('fs');
const vm = require('vm');
const [jsPath, dataPath, runsArg, maxArg, devArg] = process.argv.slice(2);
// The file ends with an ESM export line: strip it and evaluate the rest as a script.
const src = fs.readFileSync(jsPath, 'utf8').replace(/^export\s*\{[^}]*\};?/m, '');
vm.runInThisContext(src, {filename: jsPath});
const pad = globalThis.process_alloc_data;
if (typeof pad !== 'function') throw new Error(`${jsPath}: no process_alloc_data function`);

function eachLine(path, cb) {
  const fd = fs.openSync(path, 'r');
  const buf = Buffer.alloc(1 << 24);
  let carry = Buffer.alloc(0), n;
  while ((n = fs.readSync(fd, buf, 0, buf.length, null)) > 0) {
    const chunk = carry.length ? Buffer.concat([carry, buf.subarray(0, n)]) : buf.subarray(0, n);
    let s = 0, i;
    while ((i = chunk.indexOf(10, s)) !== -1) { cb(chunk.toString('utf8', s, i)); s = i + 1; }
    carry = Buffer.from(chunk.subarray(s));
  }
  fs.closeSync(fd);
}

// Records: ["H", meta, devices] ["f", frame] ["F", [frame ids]] ["S", segment] ["T", device, entry]
// ["E", has_big]. A frames list is its index into the F records; {"$big": "123"} is a BigInt
// (the viewer's unpickler makes BigInts of integers wider than 8 bytes).
let t = performance.now();
const frames = [], flists = [], segments = [];
let snap = null, traces = null, hasBig = false;
eachLine(dataPath, line => {
  const r = JSON.parse(line);
  switch (r[0]) {
    case 'H': snap = r[1]; traces = Array.from({length: r[2]}, () => []); break;
    case 'f': frames.push(r[1]); break;
    case 'F': flists.push(r[1].map(i => frames[i])); break;
    case 'S': segments.push(r[1]); break;
    case 'T': { const e = r[2]; if (typeof e.frames === 'number') e.frames = flists[e.frames]; traces[r[1]].push(e); break; }
    case 'E': hasBig = r[1]; break;
  }
});
const revive = o => {
  if (Array.isArray(o)) { for (let i = 0; i < o.length; i++) o[i] = revive(o[i]); return o; }
  if (o === null || typeof o !== 'object') return o;
  if (typeof o.$big === 'string') return BigInt(o.$big);
  for (const k of Object.keys(o)) o[k] = k === 'frames' && typeof o[k] === 'number' ? flists[o[k]] : revive(o[k]);
  return o;
};
for (const s of segments) revive(s);
if (hasBig) for (const tr of traces) for (const e of tr) for (const k of Object.keys(e)) if (k !== 'frames') e[k] = revive(e[k]);
snap.segments = segments;
snap.device_traces = traces;
const parseMs = performance.now() - t;

const rawLengths = traces.map(tr => tr.length);

// annotate_snapshot as the viewer does it before any view (see docs/timeline.md for the rules).
t = performance.now();
const streams = {'0': 0}; let nextStream = 1;
const stream = v => { const k = String(v); if (!(k in streams)) streams[k] = nextStream++; return streams[k]; };
const space = () => { const m = {}; return (a, inc) => { const k = String(a); const r = m[k] ?? 0; m[k] = inc ? r + 1 : r; return r; }; };
const bver = space(), sver = space();
for (let d = 0; d < traces.length; d++) {
  const out = [];
  let prev = null;
  for (const e of traces[d]) {
    e.stream = stream(e.stream);
    switch (e.action) {
      case 'free_completed': e.version = bver(e.addr, true); break;
      case 'alloc': case 'free_requested': e.version = bver(e.addr, false); break;
      case 'segment_free': case 'segment_unmap': e.version = sver(e.addr, true); break;
      case 'segment_alloc': case 'segment_map': e.version = sver(e.addr, false); break;
    }
    if (e.action === 'free_completed' && prev && prev.action === 'free_requested' && prev.addr === e.addr) {
      prev.action = 'free';
      prev = null;
      continue;
    }
    out.push(e);
    prev = e;
  }
  traces[d] = out;
}
for (const seg of segments) {
  seg.stream = stream(seg.stream);
  seg.version = sver(seg.address, false);
  let addr = seg.address;
  for (const b of seg.blocks) {
    b.addr = addr;
    addr += typeof addr === 'bigint' ? BigInt(b.size) : b.size;
    if (!('frames' in b)) {
      if (b.history && b.history.length) { b.frames = b.history[0].frames; b.requested_size = b.history[0].requested_size ?? b.history[0].real_size; }
      else { b.frames = []; b.requested_size = b.size; }
    }
    b.version = bver(b.addr, false);
  }
}
snap.categories = [];
const annotateMs = performance.now() - t;

// The viewer's default device: the longest trace among devices with a trace or a segment.
let device = devArg === '' ? null : Number(devArg);
if (device === null) {
  const hasSeg = {}; for (const s of segments) hasSeg[s.device] = true;
  let best = -1;
  traces.forEach((tr, i) => { if ((tr.length > 0 || i in hasSeg) && tr.length > best) { best = tr.length; device = i; } });
}
if (device === null || !traces[device]) throw new Error('the viewer has no device to show');

// process_alloc_data writes segment_pool_id / annotations into trace entries: restore them
// before every run so that every run does the same work.
const entries = traces[device];
const origPool = entries.map(e => e.segment_pool_id), origAnn = entries.map(e => e.annotations);
const runs = [], cpus = [];
let res = null;
for (let r = 0; r < Number(runsArg); r++) {
  for (let i = 0; i < entries.length; i++) { entries[i].segment_pool_id = origPool[i]; entries[i].annotations = origAnn[i]; }
  res = null;
  const c0 = process.cpuUsage();
  t = performance.now();
  res = pad(snap, device, false, Number(maxArg));
  runs.push(performance.now() - t);
  const c = process.cpuUsage(c0);
  cpus.push((c.user + c.system) / 1000);
}
const series = res.allocations_over_time.map(s => [s.elem, s.timesteps.length, s.offsets.length, Array.isArray(s.size) ? s.size.length : -1]);
process.stdout.write(JSON.stringify({device, raw_entries: rawLengths[device], entries: entries.length, parse_ms: parseMs, annotate_ms: annotateMs,
  runs_ms: runs, cpu_ms: cpus, max_size: res.max_size, elements_length: res.elements_length,
  max_at_time_length: res.max_at_time.length, max_rss_kb: process.resourceUsage().maxRSS, series}) + '\n');
NODE

# --- Driver: pickle -> JSON lines, Node, memsnap, the check, one table row ----------------------
python3 - "$js" "$pickle" "$memsnap" "$work" "${RUNS:-5}" "${MAX_ENTRIES:-15000}" "${DEVICE:-}" \
  "${NODE_MAX_OLD_SPACE_MB:-16384}" <<'PY'
import json, os, pickle, statistics, subprocess, sys, time, traceback
js, pkl, memsnap, work, runs, max_entries, device, heap = sys.argv[1:]
runs = int(runs)

# The conversion runs in a child process, so that its memory is given back before Node starts.
data = os.path.join(work, 'snapshot.jsonl')
t = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        with open(pkl, 'rb') as f:
            snap = pickle.load(f)
        if not isinstance(snap, dict) or 'device_traces' not in snap or 'segments' not in snap:
            print(f'bench-pytorch-viewer: error: {pkl}: not a PyTorch snapshot with device_traces and segments', file=sys.stderr)
            os._exit(2)
        has_big = False
        def big(v):  # the viewer's unpickler reads integers of more than 8 bytes as BigInt
            global has_big
            if type(v) is int and not -2**63 <= v < 2**63:
                has_big = True
                return {'$big': str(v)}
            return v
        frame_ids, flist_ids = {}, {}
        def flist(fr, out):
            k = flist_ids.get(id(fr))
            if k is None:
                ids = []
                for fd in fr:
                    i = frame_ids.get(id(fd))
                    if i is None:
                        i = frame_ids[id(fd)] = len(frame_ids)
                        out.write('["f",' + json.dumps(fd, separators=(',', ':')) + ']\n')
                    ids.append(i)
                k = flist_ids[id(fr)] = len(flist_ids)
                out.write('["F",' + json.dumps(ids, separators=(',', ':')) + ']\n')
            return k
        def conv(o, out):
            if isinstance(o, dict):
                return {k: (flist(v, out) if k == 'frames' and isinstance(v, list) else conv(v, out)) for k, v in o.items()}
            if isinstance(o, (list, tuple)):
                return [conv(v, out) for v in o]
            return big(o)
        with open(data, 'w') as out:
            meta = {k: conv(v, out) for k, v in snap.items() if k not in ('segments', 'device_traces')}
            out.write(json.dumps(['H', meta, len(snap['device_traces'])], separators=(',', ':')) + '\n')
            for s in snap['segments']:
                out.write('["S",' + json.dumps(conv(s, out), separators=(',', ':')) + ']\n')
            for d, tr in enumerate(snap['device_traces']):
                for e in tr:
                    e = {k: (flist(v, out) if k == 'frames' and isinstance(v, list) else big(v) if type(v) is int else conv(v, out))
                         for k, v in e.items()}
                    out.write('["T",%d,%s]\n' % (d, json.dumps(e, separators=(',', ':'))))
            out.write(json.dumps(['E', has_big]) + '\n')
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)
rc = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
if rc != 0:
    sys.exit(f'bench-pytorch-viewer: error: {pkl}: could not be read with pickle (above)' if rc == 1 else rc)
convert_s = time.perf_counter() - t

p = subprocess.run(['node', f'--max-old-space-size={heap}', os.path.join(work, 'run.cjs'), js, data,
                    str(runs), max_entries, device], capture_output=True, text=True)
if p.returncode != 0:
    tail = (p.stderr.strip().splitlines() or ['(no message)'])[-1]
    sys.exit(f'bench-pytorch-viewer: error: node failed (exit {p.returncode}): {tail}')
js_res = json.loads(p.stdout)
os.unlink(data)

dev = str(js_res['device'])
out_json = os.path.join(work, 'memsnap.json')
times, cpus, rss = [], [], 0
for _ in range(runs):
    with open(out_json, 'w') as o:
        t = time.perf_counter()
        p = subprocess.Popen([memsnap, 'timeline', pkl, '--viewer-data', '--max-entries', max_entries, '--device', dev], stdout=o)
        _, status, ru = os.wait4(p.pid, 0)
        times.append(time.perf_counter() - t)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f'bench-pytorch-viewer: error: memsnap failed on {pkl}')
    cpus.append(ru.ru_utime + ru.ru_stime)
    rss = max(rss, ru.ru_maxrss)
with open(out_json) as f:
    ms = json.load(f)
ms_series = [[s['elem'], len(s['timesteps']), len(s['offsets']), len(s['size']) if isinstance(s['size'], list) else -1]
             for s in ms['allocations_over_time']]
checks = {
    'max_size': (js_res['max_size'], ms['max_size']),
    'elements_length': (js_res['elements_length'], ms['elements_length']),
    'max_at_time length': (js_res['max_at_time_length'], len(ms['max_at_time'])),
    'series': (len(js_res['series']), len(ms_series)),
}
bad = [f'{k}: PyTorch {a}, memsnap {b}' for k, (a, b) in checks.items() if a != b]
if not bad and js_res['series'] != ms_series:
    i = next(i for i, (a, b) in enumerate(zip(js_res['series'], ms_series)) if a != b)
    bad.append(f'series {i}: PyTorch {js_res["series"][i]}, memsnap {ms_series[i]}')

js_ms, js_cpu = statistics.median(js_res['runs_ms']), statistics.median(js_res['cpu_ms'])
mem_ms, mem_cpu = statistics.median(times) * 1000, statistics.median(cpus) * 1000
print(f'file: {pkl} ({os.path.getsize(pkl):,} bytes), device {dev}, {js_res["raw_entries"]:,} trace entries '
      f'({js_res["entries"]:,} once the viewer merges free_requested/free_completed pairs), '
      f'{js_res["elements_length"]:,} elements, {len(ms_series):,} series')
print(f'PyTorch process_alloc_data (node {subprocess.run(["node", "--version"], capture_output=True, text=True).stdout.strip()}): '
      f'median {js_ms:.1f} ms of {runs} ({", ".join(f"{x:.1f}" for x in js_res["runs_ms"])}), CPU {js_cpu:.1f} ms; '
      f'JSON parse {js_res["parse_ms"]:.0f} ms, annotate {js_res["annotate_ms"]:.0f} ms; node peak RSS {js_res["max_rss_kb"] // 1024:,} MiB; python3 pickle->JSON {convert_s:.1f} s (not counted)')
print(f'memsnap timeline --viewer-data: median {mem_ms:.1f} ms of {runs} ({", ".join(f"{x * 1000:.1f}" for x in times)}), '
      f'CPU {mem_cpu:.1f} ms, peak RSS {rss // 1024:,} MiB')
print('outputs agree: ' + ('yes (max_size, elements_length, max_at_time length, every series\' elem and lengths)'
                           if not bad else 'NO: ' + '; '.join(bad)))
print(f'| {os.path.basename(pkl)} | {js_res["raw_entries"]:,} | {js_ms:,.1f} ({js_cpu:,.1f}) | {js_res["parse_ms"]:,.0f} | '
      f'{mem_ms:,.1f} ({mem_cpu:,.1f}) | {js_ms / mem_ms:.1f} ({js_cpu / mem_cpu:.1f}) |')
sys.exit(1 if bad else 0)
PY
