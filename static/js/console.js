/* Console page: a virtual list of an agent's live output, with follow / pause, earlier lines loaded
   from the file, per-line times, search over the loaded lines, line links and keyboard shortcuts.

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

   Keys: f follow/pause, / search, Enter / Shift+Enter next / previous match, g top (and load
   earlier), G bottom (and follow), Esc leaves the search box. */
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
  var wsUrl = root.getAttribute("data-ws-url");
  var linesUrl = root.getAttribute("data-lines-url") || "";
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
  var needle = "";
  var matches = []; // numbers of the loaded lines that match, ascending
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
    return { n: row[0], ms: row[1], tx: row[2], k: row[3] || "" };
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

  function isHit(e) { return !e.gap && needle && e.tx.toLowerCase().indexOf(needle) >= 0; }

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
    append(rows);
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
    append(rows);
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
    if (before < end) replacement.push({ n: before, c: end - before, gap: true });
    var above = i <= firstVisible(); // the gap starts at or above the screen: keep what it showed in place
    Array.prototype.splice.apply(lines, [i, 1].concat(replacement));
    realCount += rows.length;
    if (needle) recount();
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
    if (!(onlyMatches.checked && needle)) { shown = null; return; }
    shown = [];
    for (var i = 0; i < lines.length; i++) if (lines[i].gap || isHit(lines[i])) shown.push(i);
  }

  function fmtTime(ms) {
    if (!ms) return "";
    var d = new Date(ms);
    function p(v, w) { v = String(v); while (v.length < w) v = "0" + v; return v; }
    return p(d.getUTCHours(), 2) + ":" + p(d.getUTCMinutes(), 2) + ":" + p(d.getUTCSeconds(), 2) + "." + p(d.getUTCMilliseconds(), 3);
  }

  function textNode(parent, text) {
    if (!needle) { parent.textContent = text; return; }
    var hay = text.toLowerCase(), from = 0, i = hay.indexOf(needle);
    while (i >= 0) {
      if (i > from) parent.appendChild(document.createTextNode(text.slice(from, i)));
      var mk = document.createElement("mark");
      mk.textContent = text.slice(i, i + needle.length);
      parent.appendChild(mk);
      from = i + needle.length;
      i = hay.indexOf(needle, from);
    }
    if (from < text.length) parent.appendChild(document.createTextNode(text.slice(from)));
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
    textNode(tx, e.tx);
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
    if (needle) {
      matchEl.textContent = current >= 0
        ? (current + 1) + " / " + matches.length + " (loaded lines)"
        : matches.length + " match" + (matches.length === 1 ? "" : "es") + " (loaded lines)";
    } else {
      matchEl.textContent = "";
    }
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

  function runSearch() {
    needle = search.value.trim().toLowerCase();
    version++;
    current = -1;
    recount();
    buildShown();
    schedule();
  }

  function jump(delta) {
    if (!matches.length) return;
    current = (current + delta + matches.length) % matches.length;
    setFollow(false);
    target = matches[current];
    showTarget();
    status();
  }

  var searchTimer = null;
  search.addEventListener("input", function () {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(runSearch, 120);
  });
  search.addEventListener("keydown", function (e) {
    if (e.key === "Enter") {
      e.preventDefault();
      if (search.value.trim().toLowerCase() !== needle) runSearch();
      jump(e.shiftKey ? -1 : 1);
    }
  });
  document.getElementById("console-next").addEventListener("click", function () { jump(1); });
  document.getElementById("console-prev").addEventListener("click", function () { jump(-1); });
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
      if (numbered && snapshotSeen) merge(frame.rows); else replaceAll(frame.rows);
      added = 0;
    } else {
      added = append(frame.rows);
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
    replaceAll(rows);
    snapshotSeen = true;
    buildShown();
    schedule();
    if (targetPending && indexOf(target) >= 0) { targetPending = false; showTarget(); }
  }

  setFollow(follow);
  if (wsUrl) connect(); else showArchived();
})();
