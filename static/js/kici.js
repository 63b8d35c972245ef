/* KiCI Scaler Console: small page behaviours shared by every page (no framework beyond htmx).

   1. The "kici-live" htmx extension, enabled next to "ws" (hx-ext="ws,kici-live") on a ws-connect
      element. The server pushes one message per event with several top-level elements, each swapped
      out-of-band. A page shows only some of them, so before htmx swaps the message this extension
      - drops elements whose out-of-band target is not on this page (no console noise),
      - "upserts" rows: in <tbody hx-swap-oob="afterbegin:#agent-rows" data-upsert>, a <tr id=...>
        already on the page is replaced in place (right here), a new one is inserted at the top;
        of several rows with one id in a frame only the last counts,
      - removes the rows named in data-remove="id id" (rows that left the page's view), and with
        data-sync every row of the target with an id that the frame does not carry (live.rows),
      - takes the console's clock from data-server-time on any top-level element (see 3.),
      - keeps only rows matching the target's data-accept selector, if it has one
        (e.g. data-accept='[data-scaler="ci"]' on a scaler page's event table),
      - trims a tbody with data-max-rows after the swap, removes a table's "nothing here"
        placeholder row (tr.empty-row) once a live row has arrived in its tbody, and puts back
        the tbody's data-empty text when live removals emptied it.
   2. A connection indicator: an element with [data-live-status] inside the ws-connect element shows
      open / closed ("signed out" for close code 4401, "no access" for 4403) of that socket and of
      the page's hidden row sockets ([data-rows-socket]), the worst of them; after a reconnect, "kici:resync" is fired on the body so tables re-fetch what
      was missed while the socket was away (messages sent meanwhile are lost).
   3. Relative times: <time data-rel datetime="ISO"> shows "12s ago", refreshed every second (and
      after every swap) on the console's clock: the page's <meta name="kici-server-time"> and the
      data-server-time of every push set the offset to the browser's clock; no per-second pushes.
      With data-warn-after / data-late-after (seconds) the element gets the class age-ok,
      age-warn (amber) or age-late (red) as it ages (a heartbeat: kici_ui.heartbeat_age).
   4. Needs attention: the nav badge (#attention-badge, data-count) is kept current over
      ws/attention/; a [data-notify-toggle] button opts this browser in to a notification
      (Notification API, remembered in localStorage) whenever the count goes up.
   5. Keyboard: "/" focuses the page's [data-search] input, "?" opens the shortcut help, Esc leaves
      an input. Pages may add their own keys (see console.js).
   6. Bulk selection: a form[data-bulk] with an id owns the checkboxes that name it (form="<id>",
      one per row, e.g. /agents/); a [data-pick-all] box ticks every one of its table, the form's
      [data-picked] says how many are ticked and its buttons stay disabled while none is; a row
      replaced by a live update keeps its tick (1.).
   7. A control with data-autosubmit submits its form when it changes. */
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
      var clock = el.getAttribute("data-server-time");
      if (clock) setServerTime(clock);
      var sel = oobSelector(el);
      var target = null;
      try { target = sel ? document.querySelector(sel) : null; } catch (e) { target = null; }
      if (!target) return; // not on this page
      (el.getAttribute("data-remove") || "").split(" ").forEach(function (id) {
        var gone = id && document.getElementById(id);
        if (gone && target.contains(gone)) gone.parentNode.removeChild(gone);
      });
      if (el.hasAttribute("data-sync")) {
        var keep = {};
        Array.prototype.forEach.call(el.children, function (row) { keep[row.id] = true; });
        Array.prototype.slice.call(target.children).forEach(function (row) {
          if (row.id && !keep[row.id]) target.removeChild(row);
        });
      }
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
            keepPicked(existing, fresh);
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
    // Swaps done here (removals, in-place rows) still need the trim and the clock.
    setTimeout(function () { trim(); refreshTimes(); }, 0);
    return out.join("\n");
  }

  // A row replaced by a live update keeps its checkbox ticked (a bulk selection survives heartbeats).
  function keepPicked(old, fresh) {
    Array.prototype.forEach.call(old.querySelectorAll("input[type=checkbox]:checked"), function (box) {
      var same = fresh.querySelector('input[type=checkbox][name="' + CSS.escape(box.name) + '"][value="' + CSS.escape(box.value) + '"]');
      if (same) same.checked = true;
    });
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
    document.querySelectorAll("tbody[data-empty]").forEach(function (body) {
      if (body.children.length) return;
      var head = body.parentNode.querySelector("thead tr");
      var row = document.createElement("tr");
      row.className = "empty-row";
      row.innerHTML = '<td class="empty"></td>';
      row.firstChild.colSpan = head ? head.children.length : 1;
      row.firstChild.textContent = body.getAttribute("data-empty");
      body.appendChild(row);
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
  // Close codes of live.session: the session ended (sign-out, expiry), or the permission went.
  var SIGNED_OUT = 4401, FORBIDDEN = 4403;
  var STATUS_TEXT = { open: "live", closed: "disconnected", "signed-out": "signed out", forbidden: "no access" };
  // The last state of each socket; an indicator shows the worst of its own socket's and of the
  // page's hidden row sockets ([data-rows-socket]), so a page whose rows stopped says so.
  var socketStates = new Map();
  var WORST = ["signed-out", "forbidden", "closed", "connecting", "open"];
  function worst(a, b) { return WORST.indexOf(a) <= WORST.indexOf(b) ? a : b; }
  function showStatus() {
    var rows = "open";
    socketStates.forEach(function (state, elt) {
      if (!document.body.contains(elt)) socketStates.delete(elt);
      else if (elt.hasAttribute("data-rows-socket")) rows = worst(rows, state);
    });
    socketStates.forEach(function (own, elt) {
      var s = elt.querySelector("[data-live-status]");
      if (!s) return;
      var state = worst(own, rows);
      s.classList.toggle("is-open", state === "open");
      s.classList.toggle("is-closed", state !== "open" && state !== "connecting");
      s.textContent = STATUS_TEXT[state] || "connecting";
    });
  }
  function setStatus(elt, state) {
    socketStates.set(elt, state);
    showStatus();
  }
  window.kiciLiveStatusText = function (code) {
    return code === SIGNED_OUT ? STATUS_TEXT["signed-out"] : code === FORBIDDEN ? STATUS_TEXT.forbidden : STATUS_TEXT.closed;
  };
  document.addEventListener("htmx:wsOpen", function (e) {
    var elt = e.target;
    setStatus(elt, "open");
    // A socket that sends a full snapshot on every connect (ws/attention/) needs no resync.
    if (opened.has(elt) && !elt.hasAttribute("data-no-resync")) htmx.trigger(document.body, "kici:resync");
    opened.add(elt);
  });
  document.addEventListener("htmx:wsClose", function (e) {
    var code = e.detail && e.detail.event ? e.detail.event.code : 0;
    setStatus(e.target, code === SIGNED_OUT ? "signed-out" : code === FORBIDDEN ? "forbidden" : "closed");
  });
  // An ended agent's header replaces its indicator (live.rows.AgentPage): show the state on any new one.
  document.addEventListener("htmx:wsAfterMessage", showStatus);
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
  var REL_REFRESH_MS = 1000;
  // The console's clock minus the browser's (ms): ages are counted on the console's clock, so a
  // browser whose clock is off does not show healthy agents as stale (or from the future).
  var skewMs = 0;
  function setServerTime(iso) {
    var t = Date.parse(iso);
    if (!isNaN(t)) skewMs = t - Date.now();
  }
  (function () {
    var m = document.querySelector('meta[name="kici-server-time"]');
    if (m) setServerTime(m.getAttribute("content"));
  })();
  function refreshTimes() {
    var now = Date.now() + skewMs;
    document.querySelectorAll("time[data-rel]").forEach(function (t) {
      var d = Date.parse(t.getAttribute("datetime"));
      if (isNaN(d)) return;
      var age = (now - d) / 1000;
      var text = rel(age);
      if (t.textContent !== text) t.textContent = text;
      var warn = t.getAttribute("data-warn-after");
      if (warn === null) return;
      var late = parseFloat(t.getAttribute("data-late-after"));
      var level = age > late ? "age-late" : age > parseFloat(warn) ? "age-warn" : "age-ok";
      if (!t.classList.contains(level)) {
        t.classList.remove("age-ok", "age-warn", "age-late");
        t.classList.add(level);
      }
    });
  }
  window.kiciRefreshTimes = refreshTimes;
  setInterval(refreshTimes, REL_REFRESH_MS);
  document.addEventListener("htmx:afterSettle", refreshTimes);
  document.addEventListener("DOMContentLoaded", refreshTimes);

  // ---- needs attention: an opt-in browser notification when the count goes up ----------------
  var NOTIFY_KEY = "kici-notify-attention";
  var attentionSeen = null;
  function attentionCount() {
    var b = document.getElementById("attention-badge");
    return b ? parseInt(b.getAttribute("data-count"), 10) || 0 : null;
  }
  function notifying() {
    try {
      return !!window.Notification && Notification.permission === "granted" && localStorage.getItem(NOTIFY_KEY) === "1";
    } catch (e) { return false; }
  }
  function showNotifyToggle() {
    document.querySelectorAll("[data-notify-toggle]").forEach(function (b) {
      b.hidden = !window.Notification || Notification.permission === "denied";
      b.textContent = notifying() ? "Stop notifying" : "Notify me in this browser";
      b.setAttribute("aria-pressed", notifying() ? "true" : "false");
    });
  }
  function checkAttention() {
    var n = attentionCount();
    if (n === null) return;
    if (attentionSeen !== null && n > attentionSeen && notifying()) {
      var badge = document.getElementById("attention-badge");
      new Notification("KiCI: " + n + (n === 1 ? " thing needs" : " things need") + " you", {
        body: (badge.getAttribute("title") || "").replace(/^Needs attention: /, ""),
        tag: "kici-attention",
      });
    }
    attentionSeen = n;
  }
  document.addEventListener("click", function (e) {
    var button = e.target.closest && e.target.closest("[data-notify-toggle]");
    if (!button || !window.Notification) return;
    if (notifying()) {
      localStorage.removeItem(NOTIFY_KEY);
      showNotifyToggle();
      return;
    }
    Notification.requestPermission().then(function (permission) {
      if (permission === "granted") localStorage.setItem(NOTIFY_KEY, "1");
      showNotifyToggle();
    });
  });
  document.addEventListener("htmx:wsAfterMessage", checkAttention);
  document.addEventListener("DOMContentLoaded", function () { attentionSeen = attentionCount(); showNotifyToggle(); });

  // ---- bulk selection ----------------------------------------------------------------------
  function countPicked() {
    document.querySelectorAll("form[data-bulk][id]").forEach(function (form) {
      var n = document.querySelectorAll('input[type=checkbox][form="' + CSS.escape(form.id) + '"]:checked').length;
      var label = form.querySelector("[data-picked]");
      if (label) label.textContent = n ? n + " selected" : "none selected";
      form.querySelectorAll("button[type=submit]").forEach(function (b) { b.disabled = !n; });
    });
  }
  document.addEventListener("change", function (e) {
    var t = e.target;
    if (!t || t.type !== "checkbox") return;
    if (t.hasAttribute("data-pick-all")) {
      var table = t.closest("table");
      if (table) table.querySelectorAll("tbody input[type=checkbox][form]").forEach(function (box) { box.checked = t.checked; });
    }
    countPicked();
  });
  document.addEventListener("htmx:afterSettle", countPicked);

  // ---- forms that submit on change (in place of onchange="" attributes, refused by the CSP) ---
  document.addEventListener("change", function (e) {
    var t = e.target;
    if (t && t.hasAttribute && t.hasAttribute("data-autosubmit") && t.form) t.form.requestSubmit();
  });
  document.addEventListener("htmx:wsAfterMessage", countPicked);
  document.addEventListener("DOMContentLoaded", countPicked);

  // ---- the pause banner changed (pushed by the attention socket): panels showing a pause re-fetch
  // themselves on "kici:pauses" ---------------------------------------------------------------------
  var pausesSeen = null;
  function checkPauses() {
    var banner = document.getElementById("pause-banner");
    if (!banner) return;
    var now = banner.hidden ? "" : banner.textContent.trim();
    if (pausesSeen !== null && now !== pausesSeen) document.body.dispatchEvent(new CustomEvent("kici:pauses"));
    pausesSeen = now;
  }
  document.addEventListener("DOMContentLoaded", checkPauses);
  document.addEventListener("htmx:wsAfterMessage", checkPauses);

  // ---- a field whose editing picks a choice (data-picks="<radio id>"): typing entries into the
  // host-access editor while "Default" is chosen means the explicit list (the preview follows) ----
  document.addEventListener("input", function (e) {
    var t = e.target, id = t && t.getAttribute && t.getAttribute("data-picks");
    var radio = id && document.getElementById(id);
    if (radio && !radio.checked) radio.checked = true;
  }, true);

  // ---- keyboard ------------------------------------------------------------------------------
  function typing(e) {
    var t = e.target;
    if (!t) return false;
    if (t.tagName === "INPUT") return !/^(checkbox|radio|button|submit)$/.test(t.type);  // a ticked box is not typing
    return t.isContentEditable || /^(TEXTAREA|SELECT)$/.test(t.tagName);
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
