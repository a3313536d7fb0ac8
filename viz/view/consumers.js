/* SPDX-License-Identifier: MIT
 * memsnap view: the top consumers at the selected moment (embedded before view.js; no library).
 * docs/view.md, "Alive at the selected moment".
 *
 * window.memsnapConsumers.table(root, ctx) draws, under the flame graph, what is alive at the
 * moment grouped by source line (the innermost Python frame the stack shows, else its innermost
 * shown frame), by category (when the page has them) or by stack, with bytes, share and count per
 * group: sortable by a click on a column's head (a button: the keyboard sorts too), all groups
 * downloadable as CSV. ctx = {el, fmtSize, items: [{size, source, category, stack (its text, innermost first)}], moment, total,
 * hasCategories}. Every name is shown through textContent. Returns {groups(by), csv(by), sort(col),
 * rows ()}: the groups as [name, bytes, count], biggest first unless sorted otherwise.
 */
(function () {
  "use strict";

  var SHOWN = 100;

  function csvField(v) {
    var t = String(v);
    return /[",\n\r]/.test(t) ? '"' + t.replace(/"/g, '""') + '"' : t;
  }

  function table(root, ctx) {
    var el = ctx.el, items = ctx.items, by = "source", sortCol = 1, sortDown = true;
    var box = el("div", "consumers", root);
    var head = el("div", "consumers-head", box);
    el("b", "", head, "Top consumers ");
    var lab = el("label", "", head, "by "), sel = el("select", "", lab);
    [["source", "source line"], ["category", "category"], ["stack", "stack"]].forEach(function (o) {
      if (o[0] === "category" && !ctx.hasCategories) return;
      el("option", "", sel, o[1]).value = o[0];
    });
    var bcsv = el("button", "", head, "Download CSV");
    var note = el("span", "note", head);
    var tab = el("table", "figures", box);
    function groups(b) {
      var m = new Map();
      items.forEach(function (x) {
        var k = x[b || by], g = m.get(k);
        if (!g) { g = [k, 0, 0]; m.set(k, g); }
        g[1] += x.size; g[2]++;
      });
      var out = Array.from(m.values());
      out.sort(function (p, q) {
        var d = sortCol === 0 ? (p[0] < q[0] ? -1 : p[0] > q[0] ? 1 : 0) : p[sortCol] - q[sortCol];
        return (sortDown ? -d : d) || (p[0] < q[0] ? -1 : p[0] > q[0] ? 1 : 0);
      });
      return out;
    }
    function render() {
      var gs = groups();
      tab.textContent = "";
      var tr = el("tr", "", tab);
      [by === "source" ? "source line" : by, "bytes", "count", "share"].forEach(function (h, i) {
        var text = h + (i === sortCol ? (sortDown ? " \u25be" : " \u25b4") : ""), th = el("th", "", tr);
        th.setAttribute("scope", "col");
        if (i < 3) {
          /* a button, so that the keyboard sorts too (Enter, Space); the focus stays on it */
          var b = el("button", "sort", th, text);
          th.setAttribute("aria-sort", i === sortCol ? (sortDown ? "descending" : "ascending") : "none");
          b.addEventListener("click", function () {
            api.sort(i);
            var again = tab.querySelectorAll("th button")[i];
            if (again) again.focus();
          });
        } else th.textContent = text;
      });
      gs.slice(0, SHOWN).forEach(function (g) {
        var r = el("tr", "", tab);
        el("td", "", r, g[0]);
        el("td", "", r, ctx.fmtSize(g[1]));
        el("td", "", r, String(g[2]));
        el("td", "", r, (100 * g[1] / Math.max(1, ctx.total)).toFixed(1) + "%");
      });
      note.textContent = " " + gs.length + " group" + (gs.length === 1 ? "" : "s") + " at timestep " + ctx.moment
        + (gs.length > SHOWN ? "; the first " + SHOWN + " shown, all in the CSV" : "");
    }
    var api = {
      groups: groups,
      rows: function () { return tab.querySelectorAll("tr").length - 1; },
      sort: function (col) {
        if (col === sortCol) sortDown = !sortDown; else { sortCol = col; sortDown = col !== 0; }
        render();
      },
      by: function (b) { by = b; sel.value = b; render(); },
      csv: function (b) {
        var out = [(b || by) + ",bytes,count"];
        groups(b).forEach(function (g) { out.push([g[0], g[1], g[2]].map(csvField).join(",")); });
        return out.join("\n") + "\n";
      }
    };
    sel.addEventListener("change", function () { by = sel.value; render(); });
    bcsv.addEventListener("click", function () {
      var a = el("a", "", null);
      a.href = URL.createObjectURL(new Blob([api.csv()], { type: "text/csv" }));
      a.download = "top-consumers-by-" + by + "-at-" + ctx.moment + ".csv";
      document.body.appendChild(a); a.click(); a.remove();
    });
    render();
    return api;
  }

  window.memsnapConsumers = { table: table };
})();
