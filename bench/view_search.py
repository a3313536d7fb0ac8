#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Frame search on a page written by `memsnap view`, in headless Chromium in real time.

Prints what bench_view reports: "search_ms longest_task_ms index_ms matches worker_ms
max_task_ms": the medians of three rounds, the matches and the worker's time of the last one, and
the longest task of all rounds.

Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages
ended by a NUL byte on file descriptors 3 and 4), not with --dump-dom, whose virtual time stops
while the page waits for its search worker. Once the page has drawn, the frame box is focused
(the worker builds its index) and a first query waits for the index (index_ms: from the focus to
that answer). Then, three times, WORD is typed into the emptied box a letter every 80 ms, as a
person types, through the input events the page listens to; search_ms is the time from the last
keystroke to the drawn answer (the page's searchSettled), longest_task_ms the longest
main-thread task (PerformanceObserver "longtask") from the first keystroke to that answer,
matches the bands it matched by frame.
Exits 77 without chromium.

usage: view_search.py PAGE.html [WORD]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

TYPE_JS = r"""
(function (word, rounds) {
  var api = window.memsnapView;
  function wait(ms) { return new Promise(function (ok) { setTimeout(ok, ms); }); }
  function median(a) { a = a.slice().sort(function (x, y) { return x - y; }); return a[a.length >> 1]; }
  return api.whenReady.then(function () {
    var box = api.searchInputs[1], t0 = performance.now(), index = 0, times = [], tasks = [], r = null;
    box.focus();
    box.value = "\u0001no such frame\u0001";
    box.dispatchEvent(new Event("input"));
    /* one round: WORD typed a letter every 80 ms from an empty box */
    function round() {
      var longest = 0, last = 0, i = 0;
      var obs = new PerformanceObserver(function (l) {
        l.getEntries().forEach(function (e) { longest = Math.max(longest, e.duration); });
      });
      obs.observe({ entryTypes: ["longtask"] });
      return new Promise(function (ok) {
        (function key() {
          box.value = word.slice(0, ++i);
          box.dispatchEvent(new Event("input"));
          last = performance.now();
          if (i < word.length) setTimeout(key, 80);
          else setTimeout(ok, window.memsnapSearch.DEBOUNCE_MS + 1);
        })();
      }).then(function () { return api.searchSettled; }).then(function (res) {
        times.push(performance.now() - last);
        r = res;
        /* the drawing of the answer is a task of its own: let it run, then read the tasks */
        return wait(50).then(function () {
          obs.takeRecords().forEach(function (e) { longest = Math.max(longest, e.duration); });
          obs.disconnect();
          tasks.push(longest);
          box.value = ""; box.dispatchEvent(new Event("input"));
          return wait(2 * window.memsnapSearch.DEBOUNCE_MS + 200).then(function () { return api.searchSettled; });
        });
      });
    }
    var p = wait(2 * window.memsnapSearch.DEBOUNCE_MS).then(function () { return api.searchSettled; })
      .then(function () { index = performance.now() - t0; box.value = ""; });
    for (var k = 0; k < rounds; k++) p = p.then(round);
    return p.then(function () {
      return [median(times), median(tasks), index, r ? r.text : -1, r && r.ms, Math.max.apply(null, tasks)].join(" ");
    });
  });
})
"""


class Pipe:
    def __init__(self, proc, wfd, rfd):
        self.proc, self.w, self.r, self.buf, self.n = proc, wfd, rfd, b"", 0

    def send(self, method, params=None, session=None):
        self.n += 1
        msg = {"id": self.n, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        want = self.n
        while True:
            while b"\0" not in self.buf:
                chunk = os.read(self.r, 1 << 16)
                if not chunk:
                    raise RuntimeError("chromium closed the pipe")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\0", 1)
            m = json.loads(raw)
            if m.get("id") == want:
                if "error" in m:
                    raise RuntimeError("%s: %s" % (method, m["error"]))
                return m["result"]


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: view_search.py PAGE.html [WORD]")
    page, word = os.path.abspath(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "adamw"
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        sys.exit(77)
    work = tempfile.mkdtemp()
    to_c, from_me = os.pipe()
    to_me, from_c = os.pipe()
    # chromium reads its commands on fd 3 and writes its answers on fd 4 (kept open: pass_fds)
    def fds():
        os.dup2(to_c, 3)
        os.dup2(from_c, 4)
    proc = subprocess.Popen(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-dev-shm-usage", "--remote-debugging-pipe", "--user-data-dir=" + work + "/p",
         "--window-size=1200,900", "about:blank"],
        preexec_fn=fds, pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.close(to_c)
    os.close(from_c)
    p = Pipe(proc, from_me, to_me)
    try:
        target = p.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = p.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        p.send("Page.navigate", {"url": "file://" + page}, s)
        # wait for the page's API (the script runs once the page is parsed)
        for _ in range(6000):
            r = p.send("Runtime.evaluate", {"expression": "!!(window.memsnapView && window.memsnapView.whenReady)",
                                            "returnByValue": True}, s)
            if r["result"].get("value"):
                break
            subprocess.run(["sleep", "0.1"])
        r = p.send("Runtime.evaluate", {"expression": TYPE_JS + "(" + json.dumps(word) + ", 3)",
                                        "awaitPromise": True, "returnByValue": True, "timeout": 600000}, s)
        if "exceptionDetails" in r:
            sys.stderr.write("view_search: %s\n" % r["exceptionDetails"].get("text", "failed"))
            return 1
        print(r["result"]["value"])
        return 0
    finally:
        try:
            p.send("Browser.close")
        except Exception:
            pass
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
