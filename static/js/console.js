/* Console page: follow / pause, search within the loaded lines, line links, keyboard shortcuts.

   Lines arrive over the WebSocket as <tr> rows swapped into #console-lines by the htmx ws extension
   (the consumer renders them; see templates/agents/console.html for the row shape). This script
   only watches that tbody (MutationObserver), so it works for the first snapshot, live appends and
   a reset alike. Rows: <tr id="L<seq>" data-seq class="is-error|is-marker"><td class="ln">…<td class="tx">.

   Keys: f follow/pause, / search, Enter / Shift+Enter next / previous match, g top, G bottom
   (and follow), Esc leaves the search box. */
(function () {
  "use strict";
  var root = document.getElementById("console-root");
  if (!root) return;
  var view = document.getElementById("console-view");
  var body = document.getElementById("console-lines");
  var followBtn = document.getElementById("console-follow");
  var search = document.getElementById("console-search");
  var onlyMatches = document.getElementById("console-only-matches");
  var countEl = document.getElementById("console-count");
  var matchEl = document.getElementById("console-matches");
  var newEl = document.getElementById("console-new");
  var maxRows = parseInt(root.getAttribute("data-max-rows"), 10) || 20000;

  var follow = true;
  var unseen = 0;
  var matches = [];
  var current = -1;
  var targetSeq = null;
  var autoscrolling = false;
  var snapshotSeen = false; // the first frame is the snapshot: not "new" lines

  var m = /^#L(\d+)$/.exec(location.hash);
  if (m) { targetSeq = m[1]; follow = false; }

  function setFollow(on) {
    follow = on;
    followBtn.classList.toggle("is-on", on);
    followBtn.setAttribute("aria-pressed", on ? "true" : "false");
    followBtn.textContent = on ? "Following" : "Paused";
    root.setAttribute("data-follow", on ? "on" : "off");
    if (on) { unseen = 0; scrollBottom(); }
    status();
  }

  function scrollBottom() {
    autoscrolling = true;
    view.scrollTop = view.scrollHeight;
    requestAnimationFrame(function () { autoscrolling = false; });
  }

  function status() {
    var n = body.querySelectorAll("tr[data-seq]").length;
    countEl.textContent = n + " line" + (n === 1 ? "" : "s") + " loaded";
    newEl.textContent = !follow && unseen ? unseen + " new below (G)" : "";
  }

  // ---- search -------------------------------------------------------------------------------
  function clearMarks(row) {
    var tx = row.querySelector("td.tx");
    if (tx && tx.querySelector("mark")) tx.textContent = tx.textContent;
  }

  function markRow(row, needle) {
    var tx = row.querySelector("td.tx");
    if (!tx) return false;
    var text = tx.textContent;
    var hay = text.toLowerCase();
    var i = hay.indexOf(needle);
    if (i < 0) return false;
    var frag = document.createDocumentFragment();
    var last = 0;
    while (i >= 0) {
      frag.appendChild(document.createTextNode(text.slice(last, i)));
      var mk = document.createElement("mark");
      mk.textContent = text.slice(i, i + needle.length);
      frag.appendChild(mk);
      last = i + needle.length;
      i = hay.indexOf(needle, last);
    }
    frag.appendChild(document.createTextNode(text.slice(last)));
    tx.textContent = "";
    tx.appendChild(frag);
    return true;
  }

  function applySearch(rows, fresh) {
    var needle = search.value.trim().toLowerCase();
    if (fresh) { matches = []; current = -1; }
    rows.forEach(function (row) {
      if (fresh) clearMarks(row);
      var hit = needle ? markRow(row, needle) : false;
      if (hit) matches.push(row);
      row.classList.toggle("is-hidden", !!(needle && onlyMatches.checked && !hit));
    });
    matchEl.textContent = needle ? matches.length + " match" + (matches.length === 1 ? "" : "es") : "";
  }

  function runSearch() { applySearch(Array.prototype.slice.call(body.children), true); }

  function jump(delta) {
    if (!matches.length) return;
    current = (current + delta + matches.length) % matches.length;
    var row = matches[current];
    setFollow(false);
    row.scrollIntoView({ block: "center" });
    matches.forEach(function (r) { r.classList.remove("is-target"); });
    row.classList.add("is-target");
    matchEl.textContent = (current + 1) + " / " + matches.length;
  }

  var searchTimer = null;
  search.addEventListener("input", function () {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(runSearch, 120);
  });
  search.addEventListener("keydown", function (e) {
    if (e.key === "Enter") { e.preventDefault(); runSearch(); jump(e.shiftKey ? -1 : 1); }
  });
  onlyMatches.addEventListener("change", runSearch);

  // ---- line links -----------------------------------------------------------------------------
  function showTarget() {
    if (targetSeq === null) return;
    var row = document.getElementById("L" + targetSeq);
    if (!row) return;
    body.querySelectorAll("tr.is-target").forEach(function (r) { r.classList.remove("is-target"); });
    row.classList.add("is-target");
    row.scrollIntoView({ block: "center" });
    targetSeq = null;
  }

  body.addEventListener("click", function (e) {
    var a = e.target.closest("td.ln a");
    if (!a) return;
    e.preventDefault();
    var row = a.closest("tr");
    history.replaceState(null, "", "#" + row.id);
    targetSeq = row.getAttribute("data-seq");
    setFollow(false);
    showTarget();
    var url = location.href;
    var note = document.getElementById("console-copied");
    function done(ok) {
      note.textContent = ok ? "link to line " + targetSeqText(row) + " copied" : "link: " + url;
      setTimeout(function () { note.textContent = ""; }, 2500);
    }
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(url).then(function () { done(true); }, function () { done(false); });
    } else {
      done(false);
    }
  });
  function targetSeqText(row) { return row.getAttribute("data-seq"); }

  // ---- new rows -----------------------------------------------------------------------------
  function trim() {
    var extra = body.children.length - maxRows;
    while (extra-- > 0) body.removeChild(body.firstElementChild);
  }

  new MutationObserver(function (records) {
    var added = [];
    records.forEach(function (r) {
      r.addedNodes.forEach(function (n) { if (n.nodeType === 1 && n.tagName === "TR") added.push(n); });
    });
    if (!added.length) return;
    trim();
    matches = matches.filter(function (r) { return r.isConnected; });
    applySearch(added, false);
    if (follow) scrollBottom(); else if (snapshotSeen) unseen += added.length;
    snapshotSeen = true;
    showTarget();
    status();
  }).observe(body, { childList: true });

  view.addEventListener("scroll", function () {
    if (autoscrolling) return;
    var atBottom = view.scrollHeight - view.scrollTop - view.clientHeight < 4;
    if (follow && !atBottom) setFollow(false);
    else if (!follow && atBottom && targetSeq === null && !search.value) setFollow(true);
  });

  followBtn.addEventListener("click", function () { setFollow(!follow); });

  document.addEventListener("keydown", function (e) {
    if (e.ctrlKey || e.metaKey || e.altKey || window.kiciTyping(e)) return;
    if (e.key === "f") { e.preventDefault(); setFollow(!follow); }
    else if (e.key === "g") { e.preventDefault(); setFollow(false); view.scrollTop = 0; }
    else if (e.key === "G") { e.preventDefault(); setFollow(true); }
  }, true);

  setFollow(follow);
  applySearch(Array.prototype.slice.call(body.children), true);
  showTarget();
  status();
})();
