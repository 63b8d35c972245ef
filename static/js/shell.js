/* The shell page (templates/agents/shell.html): an xterm.js terminal (static/vendor/xterm) bridged
 * over the WebSocket #shell-root[data-ws-url] (live.consumers.ShellConsumer).
 *
 * Frames: binary both ways are the terminal's bytes (keystrokes out, output in); text frames are
 * JSON: {"opened": {...}} and {"closed": reason} from the console, {"resize": [cols, rows]} and
 * {"ack": 1} (after each output frame is drawn: ?flow=ack keeps at most a few frames in flight, so
 * a flood of output waits in the container, not in the browser) from the page. The shell is not
 * reopened by itself: a session that ended says why (#shell-status) and stays closed.
 *
 * CSP: the console's style-src allows a <style> element only with the request's nonce, which this
 * script's own tag carries. xterm.js's DOM renderer creates <style> elements (its theme and cell
 * sizes), so every <style> created on this page gets that nonce (document.createElement, wrapped
 * before the terminal opens).
 */
(function () {
  "use strict";

  var nonce = document.currentScript && document.currentScript.nonce;
  if (nonce) {
    var createElement = document.createElement;
    document.createElement = function (tagName) {
      var element = createElement.apply(document, arguments);
      if (String(tagName).toLowerCase() === "style") element.nonce = nonce;
      return element;
    };
  }

  var root = document.getElementById("shell-root");
  if (!root || !window.Terminal || !window.FitAddon) return;
  var indicator = document.getElementById("shell-indicator");
  var status = document.getElementById("shell-status");

  var CLOSE_WORDS = {
    1006: "the connection to the console was lost",
    4401: "signed out",
    4403: "no access",
    4404: "no such agent",
  };

  function setState(state, words) {
    root.dataset.state = state;
    if (indicator) {
      indicator.textContent = words;
      indicator.classList.toggle("is-open", state === "open");
      indicator.classList.toggle("is-closed", state === "closed");
    }
  }

  var term = new window.Terminal({ cursorBlink: true, scrollback: 5000, fontSize: 13 });
  var fit = new window.FitAddon.FitAddon();
  term.loadAddon(fit);
  term.open(root);
  fit.fit();

  var scheme = location.protocol === "https:" ? "wss:" : "ws:";
  var url = scheme + "//" + location.host + root.dataset.wsUrl + "?flow=ack&cols=" + term.cols + "&rows=" + term.rows;
  var socket = new WebSocket(url);
  socket.binaryType = "arraybuffer";
  var encoder = new TextEncoder();
  var endedBecause = "";

  function send(data) {
    if (socket.readyState === WebSocket.OPEN) socket.send(data);
  }

  socket.onmessage = function (event) {
    if (typeof event.data !== "string") {
      term.write(new Uint8Array(event.data), function () { send('{"ack":1}'); });
      return;
    }
    var message;
    try { message = JSON.parse(event.data); } catch (e) { return; }
    if (message.opened) {
      setState("open", "live");
      term.focus();
    } else if (message.closed) {
      endedBecause = message.closed;
    }
  };

  socket.onclose = function (event) {
    var why = endedBecause || CLOSE_WORDS[event.code] || "the connection closed (code " + event.code + ")";
    setState("closed", "closed");
    term.options.disableStdin = true;
    term.options.cursorBlink = false;
    if (status) {
      status.textContent = "The shell is closed: " + why + ". Reload the page to open a new one.";
      status.hidden = false;
    }
  };

  term.onData(function (data) { send(encoder.encode(data)); });
  term.onBinary(function (data) {
    var bytes = new Uint8Array(data.length);
    for (var i = 0; i < data.length; i++) bytes[i] = data.charCodeAt(i) & 255;
    send(bytes);
  });
  term.onResize(function (size) { send(JSON.stringify({ resize: [size.cols, size.rows] })); });

  var pending = 0;
  window.addEventListener("resize", function () {
    clearTimeout(pending);
    pending = setTimeout(function () { fit.fit(); }, 100);
  });
  // The page's keys (kici.js: Esc leaves a text box, / and ? outside one) belong to the shell here.
  root.addEventListener("keydown", function (event) { event.stopPropagation(); });
})();
