/* KiCI Scaler Console: small page behaviours shared by every page (no framework beyond htmx).

   1. The "kici-live" htmx extension, enabled next to "ws" (hx-ext="ws,kici-live") on a ws-connect
      element. The server pushes one message per event with several top-level elements, each swapped
      out-of-band. A page shows only some of them, so before htmx swaps the message this extension
      - drops elements whose out-of-band target is not on this page (no console noise),
      - "upserts" rows: in <tbody hx-swap-oob="afterbegin:#agent-rows" data-upsert>, a <tr id=...>
        already on the page is replaced in place (right here), a new one is inserted at the top;
        of several rows with one id in a frame only the last counts,
      - keeps only rows matching the target's data-accept selector, if it has one
        (e.g. data-accept='[data-scaler="ci"]' on a scaler page's tables),
      - trims a tbody with data-max-rows after the swap, and removes a table's "nothing here"
        placeholder row (tr.empty-row) once a live row has arrived in its tbody.
   2. A connection indicator: an element with [data-live-status] inside the ws-connect element shows
      open / closed; after a reconnect, "kici:resync" is fired on the body so tables re-fetch what
      was missed while the socket was away (messages sent meanwhile are lost).
   3. Relative times: <time data-rel datetime="ISO"> shows "12s ago" and is refreshed every
      REL_REFRESH_MS by the browser's clock (after every swap too), so an age keeps counting
      between server pushes; heartbeats push the agent's row at most every 10 s (agents.heartbeats).
   4. Keyboard: "/" focuses the page's [data-search] input, "?" opens the shortcut help, Esc leaves
      an input. Pages may add their own keys (see console.js). */
(function () {
  "use strict";

  function oobSelector(el) {
    var v = el.getAttribute("hx-swap-oob") || el.getAttribute("data-hx-swap-oob") || "true";
    var i = v.indexOf(":");
    if (i > 0) return v.slice(i + 1);
    return el.id ? "#" + CSS.escape(el.id) : null;
  }

  function transform(text) {
    if (text.indexOf("hx-swap-oob") < 0) return text;
    var tpl = document.createElement("template");
    tpl.innerHTML = text;
    var out = [];
    // One frame may carry several events of one agent: only its last row (latest state) counts.
    var lastRow = {};
    var upsertRows = [];
    Array.prototype.forEach.call(tpl.content.children, function (el) {
      if (!el.hasAttribute("data-upsert")) return;
      Array.prototype.forEach.call(el.children, function (row) {
        if (row.id) { lastRow[row.id] = row; upsertRows.push(row); }
      });
    });
    upsertRows.forEach(function (row) { if (lastRow[row.id] !== row) row.parentNode.removeChild(row); });
    Array.prototype.slice.call(tpl.content.children).forEach(function (el) {
      var sel = oobSelector(el);
      var target = null;
      try { target = sel ? document.querySelector(sel) : null; } catch (e) { target = null; }
      if (!target) return; // not on this page
      var accept = target.getAttribute("data-accept");
      if (accept && el.tagName === "TBODY") {
        Array.prototype.slice.call(el.children).forEach(function (row) {
          var ok = false;
          try { ok = row.matches(accept); } catch (e) { ok = false; }
          if (!ok) el.removeChild(row);
        });
        if (!el.children.length) return;
      }
      if (el.hasAttribute("data-upsert")) {
        Array.prototype.slice.call(el.children).forEach(function (row) {
          if (!row.id) return;
          var existing = document.getElementById(row.id);
          if (existing) {
            // Replace in place here: a bare <tr> cannot travel as a top-level oob element
            // (the HTML parser would wrap it in an anonymous <tbody>).
            el.removeChild(row);
            var fresh = document.importNode(row, true);
            existing.replaceWith(fresh);
            htmx.process(fresh);
          } else {
            row.classList.add("is-new");
          }
        });
        if (!el.children.length) return;
        el.removeAttribute("data-upsert");
      } else if (el.tagName === "TBODY") {
        Array.prototype.slice.call(el.children).forEach(function (row) { row.classList.add("is-new"); });
      }
      out.push(el.outerHTML);
    });
    return out.join("\n");
  }

  function trim() {
    document.querySelectorAll("[data-max-rows]").forEach(function (body) {
      var max = parseInt(body.getAttribute("data-max-rows"), 10) || 200;
      while (body.children.length > max) body.removeChild(body.lastElementChild);
    });
    // A placeholder ("No live agents.") goes as soon as its tbody holds a real row.
    document.querySelectorAll("tbody > tr.empty-row").forEach(function (empty) {
      var body = empty.parentNode;
      if (body && body.children.length > 1) body.removeChild(empty);
    });
  }

  if (window.htmx) {
    htmx.defineExtension("kici-live", {
      // Only WebSocket messages (no xhr): a normal hx-get response keeps htmx's own handling.
      transformResponse: function (text, xhr) { return xhr ? text : transform(text); },
    });
  }

  // ---- connection indicator and resync -------------------------------------------------------
  var opened = new WeakSet();
  function setStatus(elt, state) {
    var s = elt.querySelector("[data-live-status]");
    if (!s) return;
    s.classList.toggle("is-open", state === "open");
    s.classList.toggle("is-closed", state === "closed");
    s.textContent = state === "open" ? "live" : state === "closed" ? "disconnected" : "connecting";
  }
  document.addEventListener("htmx:wsOpen", function (e) {
    var elt = e.target;
    setStatus(elt, "open");
    if (opened.has(elt)) htmx.trigger(document.body, "kici:resync");
    opened.add(elt);
  });
  document.addEventListener("htmx:wsClose", function (e) { setStatus(e.target, "closed"); });
  document.addEventListener("htmx:wsAfterMessage", function () { trim(); refreshTimes(); });

  // ---- relative times ------------------------------------------------------------------------
  function rel(seconds) {
    var s = Math.max(0, Math.round(seconds));
    if (s < 60) return s + "s ago";
    var m = Math.floor(s / 60);
    if (m < 60) return m + "m ago";
    var h = Math.floor(m / 60);
    if (h < 48) return h + "h " + (m % 60) + "m ago";
    return Math.floor(h / 24) + "d ago";
  }
  var REL_REFRESH_MS = 5000;
  // The server's clock at page load (<meta name="kici-server-time">): ages are counted on it, so a
  // browser whose clock is off does not show healthy agents as stale (or from the future).
  var skewMs = 0;
  (function () {
    var m = document.querySelector('meta[name="kici-server-time"]');
    var t = m ? Date.parse(m.getAttribute("content")) : NaN;
    if (!isNaN(t)) skewMs = t - Date.now();
  })();
  function refreshTimes() {
    var now = Date.now() + skewMs;
    document.querySelectorAll("time[data-rel]").forEach(function (t) {
      var d = Date.parse(t.getAttribute("datetime"));
      if (isNaN(d)) return;
      var text = rel((now - d) / 1000);
      if (t.textContent !== text) t.textContent = text;
    });
  }
  window.kiciRefreshTimes = refreshTimes;
  setInterval(refreshTimes, REL_REFRESH_MS);
  document.addEventListener("htmx:afterSettle", refreshTimes);
  document.addEventListener("DOMContentLoaded", refreshTimes);

  // ---- keyboard ------------------------------------------------------------------------------
  function typing(e) {
    var t = e.target;
    return t && (t.isContentEditable || /^(INPUT|TEXTAREA|SELECT)$/.test(t.tagName));
  }
  window.kiciTyping = typing;
  document.addEventListener("keydown", function (e) {
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (typing(e)) {
      if (e.key === "Escape") e.target.blur();
      return;
    }
    if (e.key === "/") {
      var s = document.querySelector("[data-search]");
      if (s) { e.preventDefault(); s.focus(); s.select && s.select(); }
    } else if (e.key === "?") {
      var d = document.getElementById("kbd-help");
      if (d && d.showModal) { e.preventDefault(); d.open ? d.close() : d.showModal(); }
    }
  });
})();
