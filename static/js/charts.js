/* Hover values and a crosshair for the console's server-rendered SVG charts (front.charts).
 *
 * Each chart carries its data in data-hover: the plot box, the drawn times [x, label] and, per
 * line, [y, formatted value] or null for each time (all in viewBox units, formatted by the
 * server). Pointing at a chart (or focusing it and pressing ← → Home End) draws a crosshair at the
 * nearest time, a dot on each line and a box with the time and every line's value; leaving hides
 * them. No library, no inline style: elements are made here with SVG attributes and classes only
 * (the console's Content-Security-Policy refuses style attributes), and listeners are delegated
 * from the document, so charts swapped in by htmx (the range picker) work without set-up.
 */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var state = new WeakMap(); // svg -> {d, parts, index}
  var active = null;

  function make(name, attrs, parent) {
    var node = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (key) { node.setAttribute(key, attrs[key]); });
    parent.appendChild(node);
    return node;
  }

  function chartOf(target) {
    var svg = target && target.closest ? target.closest("svg.chart[data-hover]") : null;
    if (!svg) return null;
    var st = state.get(svg);
    if (st === undefined) {
      var d = null;
      try { d = JSON.parse(svg.getAttribute("data-hover")); } catch (e) { d = null; }
      st = d && d.t && d.t.length ? { d: d, parts: build(svg, d), index: -1 } : null;
      state.set(svg, st);
    }
    return st ? { svg: svg, st: st } : null;
  }

  function build(svg, d) {
    var g = make("g", { "class": "chart-hover", "visibility": "hidden", "aria-hidden": "true", "font-size": "11" }, svg);
    var line = make("line", {
      "class": "chart-crosshair", "x1": 0, "x2": 0, "y1": d.box[1], "y2": d.box[3],
      "stroke": "currentColor", "stroke-dasharray": "3 3"
    }, g);
    var dots = d.s.map(function (s) {
      var tone = s.tone === "cap" ? "chart-cap" : "chart-line-" + s.tone;
      return make("circle", { "class": tone, "r": 3.5, "fill": "currentColor" }, g);
    });
    var tip = make("g", { "class": "chart-tip" }, g);
    var box = make("rect", { "class": "chart-tip-box", "rx": 3, "x": 0, "y": 0 }, tip);
    var texts = [make("text", { "class": "chart-tip-time", "x": 6, "y": 14 }, tip)];
    d.s.forEach(function (s, k) { texts.push(make("text", { "class": "chart-tip-value", "x": 6, "y": 28 + 14 * k }, tip)); });
    var live = document.createElement("p");
    live.className = "sr-only";
    live.setAttribute("aria-live", "polite");
    svg.parentNode.appendChild(live);
    return { g: g, line: line, dots: dots, tip: tip, box: box, texts: texts, live: live };
  }

  function nearest(times, x) {
    var lo = 0, hi = times.length - 1;
    while (lo < hi) {
      var mid = (lo + hi) >> 1;
      if (times[mid][0] < x) lo = mid + 1; else hi = mid;
    }
    if (lo > 0 && x - times[lo - 1][0] <= times[lo][0] - x) lo -= 1;
    return lo;
  }

  function show(chart, index, announce) {
    var d = chart.st.d, p = chart.st.parts;
    index = Math.max(0, Math.min(d.t.length - 1, index));
    chart.st.index = index;
    var x = d.t[index][0];
    p.line.setAttribute("x1", x);
    p.line.setAttribute("x2", x);
    p.texts[0].textContent = d.t[index][1];
    var said = [d.t[index][1]];
    d.s.forEach(function (s, k) {
      var v = s.v[index];
      var dot = p.dots[k];
      if (v) {
        dot.setAttribute("cx", x);
        dot.setAttribute("cy", v[0]);
        dot.setAttribute("visibility", "visible");
      } else {
        dot.setAttribute("visibility", "hidden");
      }
      var text = s.label + ": " + (v ? v[1] : "no data");
      p.texts[k + 1].textContent = text;
      said.push(text);
    });
    p.g.setAttribute("visibility", "visible");
    var size = p.tip.getBBox();
    var w = size.width + 12, h = 14 * p.texts.length + 8;
    p.box.setAttribute("width", w);
    p.box.setAttribute("height", h);
    var left = x + 8 + w > d.box[2] ? x - 8 - w : x + 8;
    p.tip.setAttribute("transform", "translate(" + Math.max(0, left) + "," + d.box[1] + ")");
    chart.svg.setAttribute("data-hover-index", String(index));
    if (announce) p.live.textContent = said.join("; ");
    active = chart;
  }

  function hide(chart) {
    if (!chart) return;
    chart.st.parts.g.setAttribute("visibility", "hidden");
    chart.svg.removeAttribute("data-hover-index");
    if (active && active.svg === chart.svg) active = null;
  }

  document.addEventListener("pointermove", function (event) {
    var chart = chartOf(event.target);
    if (active && (!chart || chart.svg !== active.svg)) hide(active);
    if (!chart) return;
    var matrix = chart.svg.getScreenCTM();
    if (!matrix) return;
    var point = new DOMPoint(event.clientX, event.clientY).matrixTransform(matrix.inverse());
    var box = chart.st.d.box;
    if (point.x < box[0] || point.x > box[2]) { hide(chart); return; }
    show(chart, nearest(chart.st.d.t, point.x), false);
  });

  document.addEventListener("pointerout", function (event) {
    if (active && !event.relatedTarget) hide(active); // the pointer left the window
  });

  document.addEventListener("keydown", function (event) {
    var chart = chartOf(event.target);
    if (!chart) return;
    var last = chart.st.d.t.length - 1, at = chart.st.index;
    var moves = { ArrowLeft: at < 0 ? last : at - 1, ArrowRight: at < 0 ? last : at + 1, Home: 0, End: last };
    if (event.key === "Escape") { hide(chart); return; }
    if (!(event.key in moves)) return;
    event.preventDefault();
    show(chart, moves[event.key], true);
  });

  document.addEventListener("focusout", function (event) {
    var chart = chartOf(event.target);
    if (chart) hide(chart);
  });
})();
