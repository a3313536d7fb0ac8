# SPDX-License-Identifier: MIT
"""The notebook test (ctest "python_notebook", issue #29): a small notebook that loads a snapshot,
displays .view() and runs `%load_ext memsnap` and `%memsnap_view`, executed by nbclient on an
ipykernel kernel; each output holds the viewer's page in an iframe srcdoc. Then that output is
opened in headless Chromium with every host unreachable: the page inside the iframe becomes ready
and its timeline canvas has drawn pixels.
usage: notebook.py SNAPSHOT WORKDIR CHROMIUM   (MEMSNAP_PREFIX and PYTHONPATH set by run.sh)"""
import os
import re
import subprocess
import sys

import nbformat
from nbclient import NotebookClient

snap, work, chromium = sys.argv[1], sys.argv[2], sys.argv[3]
nb = nbformat.v4.new_notebook()
nb.cells = [
    nbformat.v4.new_code_cell("import memsnap, pickle\n"
                              f"snap = memsnap.load({snap!r})\n"
                              "d = pickle.load(open(snap.path, 'rb'))\n"
                              "snap.view()"),
    nbformat.v4.new_code_cell("%load_ext memsnap"),
    nbformat.v4.new_code_cell(f"%memsnap_view {snap}"),
    nbformat.v4.new_code_cell("%memsnap_view d --height 500"),
    nbformat.v4.new_code_cell("%memsnap_view no-such-file.pickle",  # fails, with its message
                              metadata={"tags": ["raises-exception"]}),
]
NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": work}}).execute()
pages = []
for i in (0, 2, 3):
    outs = [o for o in nb.cells[i].outputs if o.get("output_type") == "execute_result"]
    html = outs[0]["data"].get("text/html", "") if outs else ""
    if not (html.startswith('<iframe class="memsnap-view"') and "srcdoc=" in html
            and "memsnapView" in html and "ms-bin" in html):
        sys.exit(f"FAIL: cell {i} shows no viewer page: {nb.cells[i].outputs!r:.300}")
    pages.append(html)
# (IPython shows a UsageError as its message on stderr, without a traceback)
err = "".join(o.get("text", "") for o in nb.cells[4].outputs if o.get("name") == "stderr")
if "UsageError: memsnap: cannot open 'no-such-file.pickle'" not in err:
    sys.exit(f"FAIL: %memsnap_view of a missing file: {nb.cells[4].outputs!r:.300}")
print(f"ok: notebook ran; .view() and %memsnap_view (file and dict) show the viewer, an error its message "
      f"({len(pages[0])} characters of HTML)")

# In Chromium: the output as a notebook front end shows it (UTF-8 outer page), and a check that
# waits for the iframe's page to be ready and reads its timeline canvas.
check = """<script>
window.addEventListener("load", function () {
  var f = document.querySelector("iframe.memsnap-view"), w = f.contentWindow;
  function done(v) { document.body.setAttribute("data-test", v); }
  if (!w.memsnapView) return done("FAIL: no viewer in the iframe");
  w.memsnapView.whenReady.then(function () {
    var d = f.contentDocument, st = d.body.getAttribute("data-status");
    if (st !== "ready") return done("FAIL: status " + st + ": " + d.body.getAttribute("data-error"));
    var cv = d.querySelector(".plot canvas"), px = 0;
    if (!cv || !cv.width || !cv.height) return done("FAIL: no timeline canvas");
    var a = cv.getContext("2d").getImageData(0, 0, cv.width, cv.height).data;
    for (var i = 3; i < a.length; i += 4) if (a[i] && (a[i - 3] < 250 || a[i - 2] < 250 || a[i - 1] < 250)) px++;
    done(px > 100 ? "PASS " + px : "FAIL: the timeline has " + px + " drawn pixels");
  }, function (e) { done("FAIL: " + e); });
});
</script>"""
ok = True
for n, html in enumerate(pages):
    page = os.path.join(work, f"output{n}.html")
    with open(page, "w", encoding="utf-8") as f:
        f.write('<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>' + html + check
                + "</body></html>")
    p = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                        "--no-first-run", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                        f"--user-data-dir={work}/profile{n}", "--window-size=1200,900",
                        "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
                        "--virtual-time-budget=10000", "--dump-dom", "file://" + page],
                       capture_output=True, text=True, timeout=180)
    m = re.search(r'<body data-test="([^"]*)"', p.stdout)
    verdict = m.group(1) if m else "no verdict (the page did not run)"
    print(("ok" if verdict.startswith("PASS") else "FAIL") + f": output {n} in Chromium: {verdict}")
    ok = ok and verdict.startswith("PASS")
sys.exit(0 if ok else 1)
