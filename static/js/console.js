/* Console page: a virtual list of an agent's live output, with follow / pause, earlier lines loaded
   from the file, per-line times, a search of the whole log, line links, going to a line by number,
   a summary of what is loaded and keyboard shortcuts.

   Data. The page's own WebSocket (data-ws-url, ?flow=ack: one {"ack":1} per frame handled) sends
   JSON frames {"reset": bool, "rows": [[number, ms, text, kind?, count?], ...]} (live.consumers):
   kind "e" a failure line, "m" an in-band marker, "g" a gap of `count` lines from `number` on that
   did not reach this page. Line numbers are the lines' places in the agent's file (or its
   container's output: consolelog.dockerlogs), so #L<number> links stay valid. Loaded lines live in one array sorted by number, at most data-max-lines of
   them (the oldest are dropped first, and only out of sight while paused, up to twice that);
   missing runs are gap entries, drawn as one row each, which load themselves from
   data-lines-url (?before=&limit=) when they come on screen: the head gap is "load earlier".

   Drawing. Rows have one fixed height (CSS --console-row); only the rows on screen plus an
   overscan are in the DOM (#console-lines, moved with a transform inside a canvas as tall as
   every loaded line). Frames are merged into the array at once and drawn once per animation
   frame, so a flood costs a few small DOM updates per second.

   End. The page's row socket (kici.js) keeps #console-agent-state current; once it carries
   data-ended (the agent was destroyed or failed) the page says "finished": the indicator, the
   follow button ("At the end") and no reconnect after the socket closes. Lines still in flight
   arrive on the open socket.

   Search. The query (plain text, or a regular expression with "regex"; any case unless "match
   case") marks its matches in the loaded lines and is sent to data-search-url
   (front.views.console.agent_console_search), which searches every line the agent's output still
   keeps and answers its hits (number, time, excerpt and the spans to mark), 200 at a time with a
   count of the rest. The hits are listed in #console-hits; Enter / Shift+Enter (or the arrows)
   and a click on a hit show it: the page of lines around it loads into the gap that holds it, as
   a #L<number> link does, so no line before it needs to load. A line number in #console-goto is
   shown the same way. A regular expression marks the loaded lines only once the server accepted
   it (it refuses the costly ones), so the page never runs one it refused.

   Summary. #console-summary says how many lines the log has (the highest number seen, or the last
   line a search read), how many came over this page's live stream (a new pump's backlog
   included), how many were loaded from the log (the socket's first snapshot, pages of earlier
   lines), how many are not loaded (they load on scroll) and how many are no longer kept.

   Keys: f follow/pause, / search, : go to line, Enter / Shift+Enter next / previous hit, g top
   (and load earlier), G bottom (and follow), Esc leaves the search box. */
(function () {
  "use strict";
  var root = document.getElementById("console-root");
  // A live stream (data-ws-url), or a finished agent's archive (data-static-rows: the id of a JSON
  // script holding its last rows; earlier ones load from data-lines-url as for a live stream).
  if (!root || !(root.getAttribute("data-ws-url") || root.getAttribute("data-static-rows"))) return;
  var view = document.getElementById("console-view");
  var canvas = document.getElementById("console-canvas");
  var body = document.getElementById("console-lines");
  var followBtn = document.getElementById("console-follow");
  var search = document.getElementById("console-search");
  var onlyMatches = document.getElementById("console-only-matches");
  var timesBox = document.getElementById("console-times");
  var countEl = document.getElementById("console-count");
  var matchEl = document.getElementById("console-matches");
  var newEl = document.getElementById("console-new");
  var liveEl = root.querySelector("[data-live-status]");
  var regexBox = document.getElementById("console-regex");
  var caseBox = document.getElementById("console-case");
  var gotoBox = document.getElementById("console-goto");
  var summaryEl = document.getElementById("console-summary");
  var hitsEl = document.getElementById("console-hits");
  var hitsList = document.getElementById("console-hits-list");
  var hitsSummary = document.getElementById("console-hits-summary");
  var hitsMore = document.getElementById("console-hits-more");
  var wsUrl = root.getAttribute("data-ws-url");
  var linesUrl = root.getAttribute("data-lines-url") || "";
  var searchUrl = root.getAttribute("data-search-url") || "";
  var numbered = !!linesUrl; // a file or docker logs: numbers are stable, a reconnect merges instead of replacing
  var maxLines = parseInt(root.getAttribute("data-max-lines"), 10) || 50000;
  var OVERSCAN = 30;
  var PAGE = 500;
  var rowH = parseFloat(getComputedStyle(root).getPropertyValue("--console-row")) || 18;

  // An entry: {n, ms, tx, k} (k: "" | "e" | "m"), or a gap {n, c, gap: true}.
  var lines = [];
  var realCount = 0;
  var follow = true;
  var unseen = 0;
  var snapshotSeen = false;
  var target = null;
  var targetPending = false; // a #L<number> of the address, not shown yet
  var needle = ""; // the query as typed (trimmed)
  var needleRe = null; // it as a RegExp marking the loaded lines (null: none)
  var needleG = null; // the same, global (for the spans to mark)
  var matches = []; // numbers of the loaded lines that match, ascending
  // The whole log's search: hits [number, ms, excerpt, marks] of the query `hitsQuery`, `hitsRest`
  // more beyond them, the one shown (-1: none), the request in flight.
  var hits = [], hitsRest = 0, hitCurrent = -1, hitsQuery = "", hitsError = "", searching = null;
  var liveArrived = 0; // lines that came over the socket after its snapshot
  var loadedBefore = 0; // lines loaded otherwise: the snapshot, pages of the file, the archive
  // The first line the log still holds, as the page, the lines endpoint or a search last said.
  var oldestKept = parseInt(root.getAttribute("data-oldest-line"), 10) || 1;
  var knownTotal = 0; // the last line a search read
  var current = -1;
  var shown = null; // with "only matches": indexes into lines of what is drawn
  var drawPending = false;
  var loading = null;
  var autoscrolling = false;
  var lastDrawnTop = -1;
  var ended = !!root.getAttribute("data-static-rows");
  var viewH = view.clientHeight;
  new ResizeObserver(function () { viewH = view.clientHeight; schedule(); }).observe(view);
  var version = 0; // bumped when what a row shows besides its entry changes (search, target)

  var m = /^#L(\d+)$/.exec(location.hash);
  if (m) { target = parseInt(m[1], 10); targetPending = true; follow = false; }

  // ---- the array ------------------------------------------------------------------------------
  function entry(row) {
    if (row[3] === "g") return { n: row[0], c: row[4], gap: true };
    var text = row[2];
    if (text.indexOf("\x1b") < 0) return { n: row[0], ms: row[1], tx: text, k: row[3] || "" };
    var parsed = ansi(text);
    return { n: row[0], ms: row[1], tx: parsed.text, sgr: parsed.runs, k: row[3] || "" };
  }

  // ---- terminal colours -----------------------------------------------------------------------
  // A line's ANSI escape sequences: SGR (ESC [ ... m) becomes runs [start, end, classes] over the
  // text without them (the 16 colours, bold, dim, italic, underline, inverse as a-* classes: no
  // inline style under the CSP); every other sequence (cursor moves, OSC titles) is dropped.
  var ESCAPES = /\x1b(?:\[([0-9;:?]*)([@-~])|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])/g;
  function ansi(raw) {
    var out = "", runs = [], st = {}, from = 0, m;
    function cls() {
      var c = [];
      var fg = st.inv ? st.bg : st.fg, bg = st.inv ? st.fg : st.bg;
      if (fg !== undefined) c.push("a-f" + fg);
      if (bg !== undefined) c.push("a-g" + bg);
      if (st.inv && fg === undefined) c.push("a-fi");
      if (st.inv && bg === undefined) c.push("a-gi");
      if (st.b) c.push("a-b");
      if (st.d) c.push("a-d");
      if (st.i) c.push("a-i");
      if (st.u) c.push("a-u");
      return c.join(" ");
    }
    function text(t) {
      if (!t) return;
      var c = cls();
      if (c) {
        var last = runs[runs.length - 1];
        if (last && last[1] === out.length && last[2] === c) last[1] += t.length;
        else runs.push([out.length, out.length + t.length, c]);
      }
      out += t;
    }
    function colour(p, i) { // 38/48;5;n or 38/48;2;r;g;b at p[i]: [colour or undefined, params used]
      if (p[i + 1] === 5) return [p[i + 2] < 16 ? p[i + 2] : undefined, 3];
      if (p[i + 1] === 2) return [undefined, 5];
      return [undefined, 1];
    }
    ESCAPES.lastIndex = 0;
    while ((m = ESCAPES.exec(raw)) !== null) {
      text(raw.slice(from, m.index));
      from = ESCAPES.lastIndex;
      if (m[2] !== "m") continue;
      var p = (m[1] || "0").split(/[;:]/).map(function (v) { return v === "" ? 0 : parseInt(v, 10); });
      for (var i = 0; i < p.length; i++) {
        var v = p[i];
        if (v === 0) st = {};
        else if (v === 1) st.b = true;
        else if (v === 2) st.d = true;
        else if (v === 3) st.i = true;
        else if (v === 4) st.u = true;
        else if (v === 7) st.inv = true;
        else if (v === 22) st.b = st.d = false;
        else if (v === 23) st.i = false;
        else if (v === 24) st.u = false;
        else if (v === 27) st.inv = false;
        else if (v >= 30 && v <= 37) st.fg = v - 30;
        else if (v >= 90 && v <= 97) st.fg = v - 82;
        else if (v === 39) st.fg = undefined;
        else if (v >= 40 && v <= 47) st.bg = v - 40;
        else if (v >= 100 && v <= 107) st.bg = v - 92;
        else if (v === 49) st.bg = undefined;
        else if (v === 38 || v === 48) {
          var c = colour(p, i);
          if (v === 38) st.fg = c[0]; else st.bg = c[0];
          i += c[1] - 1;
        }
      }
    }
    text(raw.slice(from));
    return { text: out, runs: runs };
  }

  function last() { return lines.length ? lines[lines.length - 1] : null; }
  function endOf(e) { return e.gap ? e.n + e.c : e.n + 1; }

  // Index of the entry holding number n (a line, or the gap over it); -1 if none.
  function indexOf(n) {
    var lo = 0, hi = lines.length - 1;
    while (lo <= hi) {
      var mid = (lo + hi) >> 1, e = lines[mid];
      if (n < e.n) hi = mid - 1;
      else if (n >= endOf(e)) lo = mid + 1;
      else return mid;
    }
    return -1;
  }

  function isHit(e) { return !e.gap && needleRe !== null && needleRe.test(e.tx); }

  // The query as RegExps for the loaded lines; a regular expression only once `accepted`.
  function buildMatcher(accepted) {
    needle = search.value.trim();
    needleRe = needleG = null;
    if (!needle || (regexBox.checked && !accepted)) return;
    var flags = caseBox.checked ? "" : "i";
    var src = regexBox.checked ? needle : needle.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    try {
      needleRe = new RegExp(src, flags);
      needleG = new RegExp(src, "g" + flags);
    } catch (err) {
      needleRe = needleG = null; // a Python expression JavaScript reads otherwise: no marks
    }
  }

  function spansOf(text) {
    var out = [], m;
    needleG.lastIndex = 0;
    while ((m = needleG.exec(text)) !== null) {
      if (!m[0].length) { needleG.lastIndex++; continue; }
      out.push([m.index, m.index + m[0].length]);
    }
    return out;
  }

  // `text` into `parent` with the spans `marks` ([start, end), ascending) in <mark>, and the
  // colour runs `runs` ([start, end, classes], ascending; optional) as classes.
  function marked(parent, text, marks, runs) {
    var cuts = [0, text.length], i;
    for (i = 0; i < marks.length; i++) cuts.push(marks[i][0], marks[i][1]);
    for (i = 0; runs && i < runs.length; i++) cuts.push(runs[i][0], runs[i][1]);
    cuts.sort(function (x, y) { return x - y; });
    var mi = 0, ri = 0;
    for (i = 0; i + 1 < cuts.length; i++) {
      var a = cuts[i], b = cuts[i + 1];
      if (a === b) continue;
      while (mi < marks.length && marks[mi][1] <= a) mi++;
      while (runs && ri < runs.length && runs[ri][1] <= a) ri++;
      var mark = mi < marks.length && marks[mi][0] <= a;
      var cls = runs && ri < runs.length && runs[ri][0] <= a ? runs[ri][2] : "";
      var piece = text.slice(a, b);
      if (!mark && !cls) { parent.appendChild(document.createTextNode(piece)); continue; }
      var el = document.createElement(mark ? "mark" : "span");
      if (cls) el.className = cls;
      el.textContent = piece;
      parent.appendChild(el);
    }
  }

  function append(rows) {
    var added = 0;
    if (!lines.length && rows.length && numbered && rows[0][0] > 1) {
      lines.push({ n: 1, c: rows[0][0] - 1, gap: true, head: true }); // what came before: "load earlier"
    }
    for (var i = 0; i < rows.length; i++) {
      var e = entry(rows[i]);
      var l = last();
      if (l && numbered && !e.gap && e.n < endOf(l)) continue; // already loaded
      if (l && numbered && e.n > endOf(l)) lines.push({ n: endOf(l), c: e.n - endOf(l), gap: true });
      lines.push(e);
      if (!e.gap) { realCount++; added++; if (isHit(e)) matches.push(e.n); }
    }
    return added;
  }

  function replaceAll(rows) {
    lines = []; realCount = 0; matches = []; current = -1;
    return append(rows);
  }

  // A reset of a numbered stream: keep what is loaded below the snapshot, take the snapshot.
  function merge(rows) {
    if (!rows.length) return;
    var first = rows[0][0];
    var keep = 0;
    while (keep < lines.length && endOf(lines[keep]) <= first) keep++;
    if (keep < lines.length && lines[keep].gap && lines[keep].n < first) {
      lines[keep].c = first - lines[keep].n; keep++;
    }
    lines.length = keep;
    recount();
    return append(rows);
  }

  function recount() {
    realCount = 0; matches = [];
    for (var i = 0; i < lines.length; i++) {
      if (!lines[i].gap) { realCount++; if (isHit(lines[i])) matches.push(lines[i].n); }
    }
    if (current >= matches.length) current = -1;
  }

  // Keep at most maxLines loaded lines. Following: the oldest go. Paused (someone is reading):
  // nothing goes up to twice the cap; beyond, the oldest above the screen, then (a numbered
  // stream, read far up) the newest, which become a gap that loads back when scrolled to.
  function trim() {
    var cap = follow ? maxLines : 2 * maxLines;
    var extra = realCount - cap;
    if (extra <= 0) return;
    var limit = follow ? lines.length : Math.max(0, firstVisible() - OVERSCAN);
    var drop = 0, dropped = 0;
    while (drop < limit && dropped < extra) { if (!lines[drop].gap) dropped++; drop++; }
    if (drop) {
      var from = lines[0].n;
      lines.splice(0, drop);
      realCount -= dropped;
      extra -= dropped;
      var n = lines.length ? lines[0].n : from;
      lines.unshift({ n: from, c: n - from, gap: true, head: true });
      while (matches.length && matches[0] < n) { matches.shift(); current--; }
      if (current < -1) current = -1;
      if (!follow) shiftScroll(1 - drop);
    }
    if (extra > 0 && numbered) {
      var keep = lines.length, cut = 0;
      while (keep > 0 && cut < extra) { keep--; if (!lines[keep].gap) cut++; }
      var start = lines[keep].n, end = endOf(last());
      lines.length = keep;
      realCount -= cut;
      lines.push({ n: start, c: end - start, gap: true });
      while (matches.length && matches[matches.length - 1] >= start) matches.pop();
      if (current >= matches.length) current = -1;
    }
  }

  function shiftScroll(rowsDelta) {
    if (!rowsDelta) return;
    autoscrolling = true;
    view.scrollTop += rowsDelta * rowH;
    requestAnimationFrame(function () { autoscrolling = false; });
  }

  // ---- loading from the file -------------------------------------------------------------------
  // Load the lines of the gap at index i that end at `before` (default: the gap's end, so the
  // lines just above what follows it; a link target inside the gap: the page around it).
  function fill(i, before) {
    var g = lines[i];
    if (!linesUrl || loading !== null || !g || !g.gap || g.done) return;
    var end = g.n + g.c;
    before = Math.max(g.n + 1, Math.min(end, before || end));
    var limit = Math.min(PAGE, before - g.n);
    loading = before;
    root.setAttribute("data-loading", "1");
    fetch(linesUrl + "?before=" + before + "&limit=" + limit, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(new Error("HTTP " + r.status)); })
      .then(function (data) { loading = null; root.removeAttribute("data-loading"); landed(before, data); })
      .catch(function () { loading = null; root.removeAttribute("data-loading"); g.done = true; schedule(); });
  }

  // Put the loaded lines (numbers below `before`) into the gap that held them, splitting it.
  function landed(before, data) {
    var i = indexOf(before - 1);
    if (i < 0 || !lines[i].gap) { schedule(); return; }
    var g = lines[i];
    var end = g.n + g.c;
    var rows = data.rows.filter(function (r) { return r[0] >= g.n && r[0] < before; });
    var first = rows.length ? rows[0][0] : before;
    var oldest = data.oldest || 1;
    var replacement = [];
    if (first > g.n) {
      // What is left above: gone from the file when it lies before its oldest line.
      replacement.push({ n: g.n, c: first - g.n, gap: true, head: g.head, done: first <= oldest || !rows.length });
    }
    rows.forEach(function (r) { replacement.push(entry(r)); });
    loadedBefore += rows.length;
    if (data.oldest) oldestKept = data.oldest;
    if (before < end) replacement.push({ n: before, c: end - before, gap: true });
    var above = i <= firstVisible(); // the gap starts at or above the screen: keep what it showed in place
    Array.prototype.splice.apply(lines, [i, 1].concat(replacement));
    realCount += rows.length;
    if (needleRe) recount();
    if (above && !follow) shiftScroll(replacement.length - 1);
    buildShown();
    schedule();
    if (target !== null && target >= first && target < before) showTarget();
  }

  // ---- drawing --------------------------------------------------------------------------------
  function total() { return shown ? shown.length : lines.length; }
  function at(i) { return shown ? lines[shown[i]] : lines[i]; }
  function firstVisible() { return Math.floor(view.scrollTop / rowH); }

  function buildShown() {
    if (!(onlyMatches.checked && needleRe)) { shown = null; return; }
    shown = [];
    for (var i = 0; i < lines.length; i++) if (lines[i].gap || isHit(lines[i])) shown.push(i);
  }

  function fmtTime(ms) {
    if (!ms) return "";
    var d = new Date(ms);
    function p(v, w) { v = String(v); while (v.length < w) v = "0" + v; return v; }
    return p(d.getUTCHours(), 2) + ":" + p(d.getUTCMinutes(), 2) + ":" + p(d.getUTCSeconds(), 2) + "." + p(d.getUTCMilliseconds(), 3);
  }

  function textNode(parent, text, runs) {
    if (!needleG && !runs) { parent.textContent = text; return; }
    marked(parent, text, needleG ? spansOf(text) : [], runs);
  }

  // Fill `div` (new or recycled) with the row of entry e.
  function fillRow(div, e) {
    div._e = e; div._v = version;
    if (e.gap) {
      div.className = "cl is-gap";
      div.removeAttribute("id");
      div.removeAttribute("data-seq");
      div.setAttribute("data-gap", e.n + "-" + (e.n + e.c - 1));
      var what = e.head ? (e.done ? "no earlier lines are kept" : "earlier lines") : "lines not loaded";
      if (e.done && !e.head) what = "lines that could not be loaded";
      div.innerHTML = '<span class="ln"></span><span class="tx"></span>';
      div.lastChild.textContent = "… " + e.c + " " + what + " (" + e.n + "–" + (e.n + e.c - 1) + ")" + (e.done || !linesUrl ? "" : ": loading");
      return div;
    }
    div.className = "cl" + (e.k === "e" ? " is-error" : e.k === "m" ? " is-marker" : "") + (e.n === target ? " is-target" : "");
    div.id = "L" + e.n;
    div.setAttribute("data-seq", e.n);
    div.removeAttribute("data-gap");
    var a = div.firstChild;
    if (!a || a.tagName !== "A") {
      div.innerHTML = '<a class="ln"></a><span class="ts"></span><span class="tx"></span>';
      a = div.firstChild;
    }
    a.href = "#L" + e.n; a.textContent = e.n;
    a.nextSibling.textContent = fmtTime(e.ms);
    var tx = div.lastChild;
    tx.textContent = "";
    textNode(tx, e.tx, e.sgr);
    return div;
  }

  function schedule() {
    if (drawPending) return;
    drawPending = true;
    requestAnimationFrame(draw);
  }

  function draw() {
    drawPending = false;
    var n = total();
    canvas.style.height = n * rowH + "px";
    if (follow) { autoscrolling = true; view.scrollTop = n * rowH; } // clamped to the bottom
    var top = firstVisible();
    var from = Math.max(0, top - OVERSCAN);
    var to = Math.min(n, top + Math.ceil(viewH / rowH) + OVERSCAN);
    // Rows already drawn for the same entry are kept (a flood slides the window by a few rows);
    // the others are recycled.
    var gapToLoad = -1;
    var want = [];
    var keep = new Set();
    for (var i = from; i < to; i++) {
      var e = at(i);
      want.push(e);
      keep.add(e);
      if (e.gap && !e.done && gapToLoad < 0 && i >= top - 2) gapToLoad = shown ? shown[i] : i;
    }
    var byEntry = new Map();
    var spare = [];
    var child = body.firstChild;
    while (child) {
      var next = child.nextSibling;
      if (keep.has(child._e) && !byEntry.has(child._e)) byEntry.set(child._e, child);
      else { body.removeChild(child); spare.push(child); }
      child = next;
    }
    var cursor = body.firstChild;
    for (var j = 0; j < want.length; j++) {
      var en = want[j];
      var node = byEntry.get(en);
      if (node) {
        if (en.gap || node._v !== version) fillRow(node, en);
      } else {
        node = fillRow(spare.pop() || document.createElement("div"), en);
      }
      if (node === cursor) cursor = cursor.nextSibling;
      else body.insertBefore(node, cursor);
    }
    body.style.transform = "translateY(" + from * rowH + "px)";
    lastDrawnTop = top;
    var l = last();
    root.setAttribute("data-last-line", l ? endOf(l) - 1 : 0);
    root.setAttribute("data-first-line", lines.length ? firstLoaded() : 0);
    status();
    if (autoscrolling) requestAnimationFrame(function () { autoscrolling = false; });
    if (gapToLoad >= 0) {
      var g = lines[gapToLoad];
      var inGap = target !== null && target >= g.n && target < g.n + g.c;
      fill(gapToLoad, inGap ? target + PAGE / 2 : 0);
    }
  }

  function firstLoaded() {
    for (var i = 0; i < lines.length; i++) if (!lines[i].gap) return lines[i].n;
    return 0;
  }

  function status() {
    countEl.textContent = realCount + " line" + (realCount === 1 ? "" : "s") + " loaded";
    newEl.textContent = !follow && unseen ? unseen + " new below (G)" : "";
    var loadedText = matches.length + " in the loaded lines";
    if (!needle) {
      matchEl.textContent = "";
    } else if (wholeLog()) {
      var all = hits.length + hitsRest;
      matchEl.textContent = (hitCurrent >= 0 ? num(hitCurrent + 1) + " / " + num(all) : plural(all, "match", "matches")) +
        " in the whole log · " + loadedText;
    } else if (current >= 0) {
      matchEl.textContent = (current + 1) + " / " + matches.length + " (loaded lines)";
    } else {
      matchEl.textContent = plural(matches.length, "match", "matches") + " (loaded lines)" + (hitsError ? "" : searching ? " · searching the whole log" : "");
    }
    summary();
  }

  function num(n) { return n.toLocaleString("en-US"); }
  function plural(n, one, many) { return num(n) + " " + (n === 1 ? one : many); }

  // What the page holds of the log (see "Summary" above).
  function summary() {
    var l = last();
    var total = Math.max(knownTotal, l ? endOf(l) - 1 : 0);
    root.setAttribute("data-total-lines", total);
    root.setAttribute("data-live-lines", liveArrived);
    if (!numbered || !total) { summaryEl.textContent = ""; return; }
    var gone = Math.max(0, oldestKept - 1);
    var missing = Math.max(0, total - gone - realCount);
    var parts = [];
    if (wsUrl) parts.push(num(liveArrived) + " came over the live stream");
    parts.push(num(loadedBefore) + (wsUrl ? " loaded from the log" : " loaded from its archive"));
    var text = plural(total, "line", "lines") + " in the " + (wsUrl ? "log" : "output") + ": " + parts.join(", ");
    if (missing) text += "; " + num(missing) + " not loaded (they load on scroll; search covers them)";
    if (gone) text += "; lines 1–" + num(gone) + " no longer kept";
    summaryEl.textContent = text;
  }

  // ---- follow, target, search -----------------------------------------------------------------
  function setFollow(on) {
    follow = on;
    followBtn.classList.toggle("is-on", on);
    followBtn.setAttribute("aria-pressed", on ? "true" : "false");
    followBtn.textContent = on ? (ended ? "At the end" : "Following") : "Paused";
    root.setAttribute("data-follow", on ? "on" : "off");
    if (on) { unseen = 0; target = null; version++; }
    schedule();
  }

  function scrollToIndex(i) {
    var pos = shown ? shown.indexOf(i) : i;
    if (pos < 0) return;
    autoscrolling = true;
    view.scrollTop = Math.max(0, pos * rowH - view.clientHeight / 2 + rowH / 2);
    requestAnimationFrame(function () { autoscrolling = false; });
    schedule();
  }

  // Show line `target`: scroll to it once loaded; a line not loaded yet is in a gap, which the
  // scroll brings on screen and so loads.
  function showTarget() {
    version++;
    if (target === null) return;
    var i = indexOf(target);
    if (i < 0) return;
    scrollToIndex(i);
  }

  // The query as sent to the server: what a hit list answers.
  function queryKey() { return search.value.trim() + "\u0000" + regexBox.checked + "\u0000" + caseBox.checked; }

  // Mark the query's matches in the loaded lines (`accepted`: the server took its expression).
  function runSearch(accepted) {
    buildMatcher(accepted);
    version++;
    current = -1;
    recount();
    buildShown();
    schedule();
  }

  // The whole log's hits are those of the query in the box.
  function wholeLog() { return !!searchUrl && !hitsError && hitsQuery === queryKey() && searching === null; }

  // Ask the server for the hits of the query numbered above `after` (0: from the start), then
  // call `then` (if any) once they are listed.
  function searchLog(after, then) {
    if (!searchUrl) return;
    if (searching) searching.abort();
    searching = null;
    var q = search.value.trim();
    if (!q) { hitsEl.hidden = true; hits = []; hitsRest = 0; hitCurrent = -1; hitsQuery = ""; hitsError = ""; status(); return; }
    var key = queryKey();
    var params = new URLSearchParams({ q: q });
    if (regexBox.checked) params.set("regex", "1");
    if (caseBox.checked) params.set("case", "1");
    if (after) params.set("after", String(after));
    var ctrl = new AbortController();
    searching = ctrl;
    root.setAttribute("data-searching", "1");
    hitsEl.hidden = false;
    if (!after) hitsSummary.textContent = "searching the whole log…";
    status();
    fetch(searchUrl + "?" + params.toString(), { credentials: "same-origin", headers: { Accept: "application/json" }, signal: ctrl.signal })
      .then(function (r) { return r.json().then(function (d) { return { ok: r.ok, status: r.status, data: d }; }); })
      .then(function (res) {
        if (searching !== ctrl) return;
        searching = null;
        root.removeAttribute("data-searching");
        if (!res.ok) { searchFailed(key, res.data.error || "HTTP " + res.status); return; }
        gotHits(key, after, res.data);
        if (then) then();
      })
      .catch(function (err) {
        if (searching !== ctrl) return;
        searching = null;
        root.removeAttribute("data-searching");
        searchFailed(key, "the search failed: " + err.message);
      });
  }

  function searchFailed(key, message) {
    hitsQuery = key;
    hitsError = message;
    hits = []; hitsRest = 0; hitCurrent = -1;
    hitsList.textContent = "";
    hitsMore.hidden = true;
    hitsSummary.textContent = message;
    hitsEl.setAttribute("data-error", "");
    if (regexBox.checked) runSearch(false); // a refused expression marks nothing
    status();
  }

  function gotHits(key, after, data) {
    hitsEl.removeAttribute("data-error");
    if (!after || key !== hitsQuery) { hits = []; hitCurrent = -1; hitsList.textContent = ""; }
    hitsQuery = key;
    hitsError = "";
    var start = hits.length;
    data.hits.forEach(function (h) { hits.push(h); });
    hitsRest = data.more;
    knownTotal = Math.max(knownTotal, data.last || 0);
    if (data.scanned && !after) oldestKept = data.first;
    var frag = document.createDocumentFragment();
    for (var i = start; i < hits.length; i++) frag.appendChild(hitItem(hits[i], i));
    hitsList.appendChild(frag);
    var all = hits.length + hitsRest;
    var text = all
      ? (hitsRest ? "the first " + num(hits.length) + " of " : "") + plural(all, "hit", "hits") + " in the whole log"
      : "no hits in the whole log";
    text += data.scanned ? " (lines " + num(data.first) + "–" + num(data.last) + ")" : " (it holds no lines)";
    if (data.stopped) text += "; the search stopped after line " + num(data.last) + ": it ran out of time";
    hitsSummary.textContent = text;
    hitsMore.hidden = !hitsRest;
    hitsMore.textContent = "next " + num(Math.min(200, hitsRest)) + " hits";
    root.setAttribute("data-hits", all);
    if (regexBox.checked) runSearch(true);
    status();
  }

  function hitItem(h, index) {
    var li = document.createElement("li");
    var b = document.createElement("button");
    b.type = "button";
    b.setAttribute("data-line", h[0]);
    b.setAttribute("data-index", index);
    b.innerHTML = '<span class="ln"></span><span class="ts"></span><span class="tx"></span>';
    b.children[0].textContent = h[0];
    b.children[1].textContent = fmtTime(h[1]);
    marked(b.children[2], h[2], h[3]);
    li.appendChild(b);
    return li;
  }

  // Show hit `i` of the whole log's list (its next page is asked for first when i is past it).
  function showHit(i) {
    if (i >= hits.length && hitsRest) { searchLog(hits[hits.length - 1][0], function () { showHit(i); }); return; }
    if (!hits.length) return;
    hitCurrent = (i + hits.length) % hits.length;
    var was = hitsList.querySelector("[aria-current]");
    if (was) was.removeAttribute("aria-current");
    var b = hitsList.querySelector('[data-index="' + hitCurrent + '"]');
    if (b) { b.setAttribute("aria-current", "true"); b.scrollIntoView({ block: "nearest" }); }
    goTo(hits[hitCurrent][0]);
  }

  function jump(delta) {
    if (wholeLog()) {
      if (!hits.length) return;
      showHit(hitCurrent < 0 ? (delta > 0 ? 0 : hits.length - 1) : hitCurrent + delta);
      return;
    }
    if (!matches.length) return;
    current = (current + delta + matches.length) % matches.length;
    setFollow(false);
    target = matches[current];
    showTarget();
    status();
  }

  // Show line n: it, or the page around it loaded into the gap that holds it.
  function goTo(n) {
    var l = last();
    var note = document.getElementById("console-copied");
    if (!l || n < 1 || n >= endOf(l)) {
      note.textContent = "line " + num(n) + " has not reached this page" + (l ? " (its last line is " + num(endOf(l) - 1) + ")" : "");
      setTimeout(function () { note.textContent = ""; }, 4000);
      return;
    }
    history.replaceState(null, "", "#L" + n);
    setFollow(false);
    target = n;
    targetPending = indexOf(n) < 0;
    showTarget();
    status();
  }

  var searchTimer = null;
  function queryChanged() {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(function () { runSearch(false); searchLog(0); }, 250);
  }
  search.addEventListener("input", queryChanged);
  regexBox.addEventListener("change", queryChanged);
  caseBox.addEventListener("change", queryChanged);
  search.addEventListener("keydown", function (e) {
    if (e.key === "Enter") {
      e.preventDefault();
      var delta = e.shiftKey ? -1 : 1;
      if (searchUrl && hitsQuery !== queryKey()) {
        clearTimeout(searchTimer);
        runSearch(false);
        searchLog(0, function () { jump(delta); });
        return;
      }
      if (searching) return; // its answer is coming
      jump(delta);
    }
  });
  document.getElementById("console-next").addEventListener("click", function () { jump(1); });
  document.getElementById("console-prev").addEventListener("click", function () { jump(-1); });
  hitsList.addEventListener("click", function (e) {
    var b = e.target.closest("button[data-index]");
    if (b) showHit(parseInt(b.getAttribute("data-index"), 10));
  });
  hitsMore.addEventListener("click", function () { if (hits.length) searchLog(hits[hits.length - 1][0]); });
  document.getElementById("console-hits-close").addEventListener("click", function () { hitsEl.hidden = true; });
  gotoBox.addEventListener("keydown", function (e) {
    if (e.key !== "Enter") return;
    e.preventDefault();
    var raw = gotoBox.value.trim().replace(/[,_\s]/g, "");
    if (!/^[0-9]+$/.test(raw)) {
      gotoBox.setCustomValidity("a line number: a whole number from 1");
      gotoBox.reportValidity();
      return;
    }
    gotoBox.setCustomValidity("");
    goTo(parseInt(raw, 10));
  });
  gotoBox.addEventListener("input", function () { gotoBox.setCustomValidity(""); });
  onlyMatches.addEventListener("change", function () { buildShown(); schedule(); });
  timesBox.addEventListener("change", function () { root.classList.toggle("hide-times", !timesBox.checked); });

  body.addEventListener("click", function (e) {
    var a = e.target.closest("a.ln");
    if (!a) return;
    e.preventDefault();
    var row = a.closest(".cl");
    var n = parseInt(row.getAttribute("data-seq"), 10);
    history.replaceState(null, "", "#L" + n);
    setFollow(false);
    target = n;
    showTarget();
    var url = location.href;
    var note = document.getElementById("console-copied");
    function done(ok) {
      note.textContent = ok ? "link to line " + n + " copied" : "link: " + url;
      setTimeout(function () { note.textContent = ""; }, 2500);
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(url).then(function () { done(true); }, function () { done(false); });
    } else {
      done(false);
    }
  });

  view.addEventListener("scroll", function () {
    if (!autoscrolling) {
      var atBottom = total() * rowH - view.scrollTop - viewH < rowH;
      if (follow && !atBottom) setFollow(false);
      else if (!follow && atBottom && target === null && !needle) setFollow(true);
    }
    if (firstVisible() !== lastDrawnTop) schedule();
  });

  followBtn.addEventListener("click", function () { setFollow(!follow); });

  window.addEventListener("hashchange", function () {
    var h = /^#L(\d+)$/.exec(location.hash);
    if (!h) return;
    setFollow(false);
    target = parseInt(h[1], 10);
    targetPending = indexOf(target) < 0;
    showTarget();
  });

  document.addEventListener("keydown", function (e) {
    if (e.ctrlKey || e.metaKey || e.altKey || window.kiciTyping(e)) return;
    if (e.key === "f") { e.preventDefault(); setFollow(!follow); }
    else if (e.key === "g") { e.preventDefault(); setFollow(false); view.scrollTop = 0; schedule(); }
    else if (e.key === "G") { e.preventDefault(); setFollow(true); }
    else if (e.key === ":") { e.preventDefault(); gotoBox.focus(); gotoBox.select(); }
  }, true);

  // ---- the socket -----------------------------------------------------------------------------
  var socket = null;
  var retry = 500;

  function setLive(state, code) {
    if (ended) state = "ended";
    liveEl.classList.toggle("is-open", state === "open");
    liveEl.classList.toggle("is-closed", state === "closed" || state === "ended");
    liveEl.textContent = state === "open" ? "live" : state === "ended" ? "finished" :
      state === "closed" ? window.kiciLiveStatusText(code) : "connecting";
  }

  // The agent ended (see "End" above): checked after every message of the page's row socket.
  function checkEnded() {
    var s = document.getElementById("console-agent-state");
    if (ended || !s || !s.hasAttribute("data-ended")) return;
    ended = true;
    setLive("ended");
    setFollow(follow);
  }
  document.addEventListener("htmx:wsAfterMessage", checkEnded);

  function onFrame(ev) {
    var frame = JSON.parse(ev.data);
    var added;
    if (frame.reset) {
      loadedBefore += numbered && snapshotSeen ? merge(frame.rows) : replaceAll(frame.rows);
      added = 0;
    } else {
      added = append(frame.rows);
      liveArrived += added;
    }
    if (!follow && snapshotSeen) unseen += added;
    snapshotSeen = true;
    trim();
    buildShown();
    socket.send('{"ack":1}');
    schedule();
    if (targetPending && indexOf(target) >= 0) { targetPending = false; showTarget(); }
  }

  function connect() {
    var scheme = location.protocol === "https:" ? "wss://" : "ws://";
    socket = new WebSocket(scheme + location.host + wsUrl + "?flow=ack");
    socket.onopen = function () { retry = 500; setLive("open"); };
    socket.onmessage = onFrame;
    socket.onclose = function (ev) {
      setLive("closed", ev.code);
      // 4401 signed out, 4403 no access, 4404 unknown: asking again cannot help.
      if (ended || ev.code === 4401 || ev.code === 4403 || ev.code === 4404) return;
      setTimeout(connect, retry);
      retry = Math.min(retry * 2, 10000);
    };
  }

  // A finished agent's archive: its last rows are in the page, nothing more will come.
  function showArchived() {
    var rows = JSON.parse(document.getElementById(root.getAttribute("data-static-rows")).textContent);
    loadedBefore += replaceAll(rows);
    snapshotSeen = true;
    buildShown();
    schedule();
    if (targetPending && indexOf(target) >= 0) { targetPending = false; showTarget(); }
  }

  setFollow(follow);
  if (wsUrl) connect(); else showArchived();
})();
