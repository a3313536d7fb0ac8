/* SPDX-License-Identifier: MIT
 * memsnap view: how a frame or a name from the data is shown (embedded before view.js; no library).
 * docs/view.md, "Stacks".
 *
 * window.memsnapFrames.keep(file, name): false for the frames PyTorch's MemoryViz leaves out of a
 * stack (its frameFilter: the unwinder and traceback gatherer, the interpreter's evaluation loop
 * and call machinery, the dispatcher's boxing and registration code), and the caching allocator's
 * own frames (c10::cuda::CUDACachingAllocator: every allocation has them, so they say nothing).
 * window.memsnapFrames.safe(text): the text with every bidirectional control (U+202A..U+202E,
 * U+2066..U+2069, U+200E, U+200F, U+061C) and every lone surrogate written as a visible escape
 * (\u202e), so that a name cannot reorder what is shown around it. The text is still shown only
 * through textContent or a canvas, never as markup.
 */
(function () {
  "use strict";

  var OMIT_NAMES = ["unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp", "_start",
                    "__libc_start_main", "PyEval_", "PyObject_", "PyFunction_", "CUDACachingAllocator"];
  var OMIT_FILES = ["core/boxing", "/Register", "/Redispatch", "pythonrun.c", "Modules/main.c",
                    "Objects/call.c", "Objects/methodobject.c", "pycore_ceval.h", "ceval.c",
                    "cpython/abstract.h", "CUDACachingAllocator"];

  function keep(file, name) {
    var i;
    for (i = 0; i < OMIT_NAMES.length; i++) if (name.indexOf(OMIT_NAMES[i]) >= 0) return false;
    for (i = 0; i < OMIT_FILES.length; i++) if (file.indexOf(OMIT_FILES[i]) >= 0) return false;
    return true;
  }

  var UNSAFE = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]|[\ud800-\udbff](?![\udc00-\udfff])|(^|[^\ud800-\udbff])([\udc00-\udfff])/g;
  function esc(c) { return "\\u" + ("000" + c.charCodeAt(0).toString(16)).slice(-4); }
  function safe(text) {
    text = String(text);
    if (!/[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]/.test(text)) return text;
    return text.replace(UNSAFE, function (m, pre, lone) {
      return lone !== undefined ? pre + esc(lone) : esc(m);
    });
  }

  window.memsnapFrames = { keep: keep, safe: safe, omitNames: OMIT_NAMES, omitFiles: OMIT_FILES };
})();
