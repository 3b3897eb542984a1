/* ringlab trace player: draws one trace, one step at a time.
 *
 * Every rank is a box (placed by Python: ring, tree, line or circle) holding its
 * buffer as chunk cells, coloured by how many ranks' contributions the chunk
 * holds after the step. Every message of the step is an arrow labelled with its
 * chunk and op. Plain JavaScript and SVG, no libraries, no network: the same code
 * runs in a notebook output, in the built book and in a saved .html file.
 * Python (ringlab/show/player/__init__.py) builds `data`; see player_data() there.
 */
(function () {
  "use strict";
  if (window.RinglabPlayer) return;      // several players on one page share this code

  var SVGNS = "http://www.w3.org/2000/svg";
  // Same colours as ringlab.figures (matplotlib's tab:blue, tab:green, tab:gray).
  var OP_COLOURS = { reduce: "#1f77b4", copy: "#2ca02c" };
  var OTHER = "#7f7f7f";
  var BASE_MS = 1000;                    // speed 1x = one step per second
  var MAX_ARROWS = 300;                  // more would be a solid blur; the list says how many
  var MAX_LISTED = 16;                   // lines in the list of a step (two columns)
  var MAX_SHOWN_HEIGHT = 500;            // px of the drawing on screen, at most

  function make(ns, tag, attrs, parent, text) {
    var node = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
    for (var k in attrs) node.setAttribute(k, attrs[k]);
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }
  function svg(tag, attrs, parent, text) { return make(SVGNS, tag, attrs, parent, text); }
  function el(tag, attrs, parent, text) { return make(null, tag, attrs, parent, text); }

  // Who contributed to a chunk comes as a hex bit mask (bit r = rank r), so any
  // world size fits in a short string. These read it back.
  function ranksOf(hex) {
    var out = [];
    for (var i = 0; i < hex.length; i++) {
      var digit = parseInt(hex.charAt(hex.length - 1 - i), 16);
      for (var b = 0; b < 4; b++) if (digit & (1 << b)) out.push(4 * i + b);
    }
    return out;
  }

  // Pale (only its own contribution) to deep blue; green once complete, as in
  // ringlab.views.holdings_table.
  function fillColour(fraction, complete) {
    if (complete) return "#1a9850";
    var a = [238, 243, 251], b = [33, 102, 172];
    var rgb = a.map(function (v, i) { return Math.round(v + (b[i] - v) * fraction); });
    return "rgb(" + rgb.join(",") + ")";
  }

  // Copy-only traces (broadcast, all-gather) move data without adding: there a
  // chunk shows *whose* data it holds, one light colour per origin rank.
  var ORIGIN = ["#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
                "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#c7c7c7"];
  var OWN = "#f4f6f9";

  function Player(root, data) {
    this.root = root;
    this.d = data;
    this.uid = root.id;
    this.step = 0;
    this.timer = null;
    this.speed = 1;
    // Events grouped by step; event = [step, src, dst, chunk index, op index, bytes, span index,
    // group index (-1: the whole world), carried ([hex mask of ranks, [chunk indices]] read from
    // the payload, or null)]. Compute events too, by the step after which they run.
    this.byStep = [];
    this.computesByStep = [];
    for (var s = 0; s <= data.steps; s++) { this.byStep.push([]); this.computesByStep.push([]); }
    var groupOf = data.eventGroups || [], carried = data.carried || [];
    data.events.forEach(function (e, i) {
      this.byStep[e[0]].push(e.concat([groupOf[i] === undefined ? -1 : groupOf[i], carried[i] || null]));
    }, this);
    (data.computes || []).forEach(function (c) {
      this.computesByStep[Math.min(c[0], data.steps)].push(c);
    }, this);
    this.states = this.replay();
    this.moveOnly = !!data.holdings && data.holdings.mode === "detail" && data.ops.length > 0 &&
      data.ops.every(function (op) { return op === "copy"; });
    this.build();
    this.show(0);
  }

  // Holdings arrive as the cells that changed at each step; rebuild the full
  // state of every step once, so that jumping around with the slider is instant.
  Player.prototype.replay = function () {
    var h = this.d.holdings;
    if (!h) return null;
    if (h.mode === "aggregate") return h.held;
    var state = h.start.slice(), states = [];
    h.changes.forEach(function (changed) {
      state = state.slice();
      changed.forEach(function (c) { state[c[0] * this.d.chunks.length + c[1]] = c[2]; }, this);
      states.push(state);
    }, this);
    return states;
  };

  // Where everything goes: a box per rank sized to its grid of chunk cells,
  // spaced so that neighbours never overlap, and the viewBox around them all.
  Player.prototype.geometry = function (mode) {
    var d = this.d, n = d.worldSize, nChunks = d.chunks.length, big = n > d.detailLimit;
    var cols = mode === "detail" ? (nChunks <= 8 ? nChunks : Math.ceil(Math.sqrt(nChunks))) : 1;
    var rows = mode === "detail" ? Math.ceil(nChunks / cols) : (mode === "aggregate" ? 1 : 0);
    var cell = mode === "detail" ? (n <= 8 ? 22 : n <= 16 ? 16 : 10) : 16;
    var chunkRow = mode === "detail" && cell >= 16 && nChunks <= 8;   // room to name the chunks
    var boxW = Math.max(cols * cell, big ? 16 : 30) + 8;
    var boxH = rows * cell + (big ? 18 : 22) + (chunkRow ? 9 : 0);
    var gap = big ? 10 : 46, kind = d.layout.kind;
    var centres = d.layout.positions.map(function (p) {
      if (kind === "tree") return { x: p[0] * (boxW + gap), y: p[1] * (boxH + 80) };
      if (kind === "line") return { x: p[0] * (boxW + gap + 80), y: 0 };
      var radius = n < 2 ? 0 : Math.max(140, (Math.max(boxW, boxH) + gap) / (2 * Math.sin(Math.PI / n)));
      // Two ranks side by side, not one above the other: a screen is wider than tall.
      if (n === 2) return { x: p[1] * radius, y: 0 };
      return { x: p[0] * radius, y: p[1] * radius };
    });
    var margin = 60, xs = centres.map(function (c) { return c.x; }), ys = centres.map(function (c) { return c.y; });
    var x0 = Math.min.apply(null, xs) - boxW / 2 - margin, y0 = Math.min.apply(null, ys) - boxH / 2 - margin;
    var w = Math.max.apply(null, xs) - x0 + boxW / 2 + margin, h = Math.max.apply(null, ys) - y0 + boxH / 2 + margin;
    // The SVG is scaled to fit its width; pick the font size that ends up ~11 px on screen.
    // Shown no taller than MAX_SHOWN_HEIGHT px, so that the player with its title and
    // controls fits the 757 px a 1400 x 900 window shows of a page.
    var shownWidth = Math.min(760, Math.max(w * 1.25, 480), MAX_SHOWN_HEIGHT * w / h);
    return { centres: centres, boxW: boxW, boxH: boxH, cell: cell, cols: cols, rows: rows, chunkRow: chunkRow,
             viewBox: [x0, y0, w, h], shownWidth: shownWidth, font: Math.max(10, 11 * w / shownWidth) };
  };

  Player.prototype.build = function () {
    var d = this.d, n = d.worldSize, nChunks = d.chunks.length, self = this;
    var mode = d.holdings ? d.holdings.mode : "none";
    this.root.innerHTML = "";            // drop the "needs JavaScript" fallback text
    this.root.setAttribute("data-ready", "1");
    this.root.setAttribute("data-layout", d.layout.kind);
    this.root.tabIndex = 0;
    el("div", { "class": "rlp-title" }, this.root, d.title);

    var geo = this.geo = this.geometry(mode), boxW = geo.boxW, boxH = geo.boxH, cell = geo.cell;
    var cols = geo.cols, rows = geo.rows, centres = geo.centres, chunkRow = geo.chunkRow;
    this.font = geo.font;

    var s = svg("svg", { "class": "rlp-svg", viewBox: geo.viewBox.join(" "), role: "img",
                         "aria-label": d.title, style: "max-width:" + geo.shownWidth + "px" }, this.root);
    // Arrowheads: one marker per colour, ids prefixed with this player's id so that
    // two players on one page never pick up each other's markers.
    var defs = svg("defs", {}, s);
    this.colours = d.ops.map(function (op) { return OP_COLOURS[op] || OTHER; }).concat([OTHER]);
    this.colours.forEach(function (colour, i) {
      var m = svg("marker", { id: self.uid + "-head" + i, viewBox: "0 0 10 10", refX: 9, refY: 5,
                               markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, defs);
      svg("path", { d: "M0,0 L10,5 L0,10 z", fill: colour }, m);
    });
    var links = svg("g", { "class": "rlp-links" }, s);
    d.layout.links.forEach(function (l) {
      var a = centres[l[0]], b = centres[l[1]];
      svg("line", { x1: a.x, y1: a.y, x2: b.x, y2: b.y }, links);
    });

    this.cells = [];
    this.badges = [];
    var nodes = svg("g", { "class": "rlp-ranks" }, s);
    centres.forEach(function (c, r) {
      var g = svg("g", { "class": "rlp-rank", "data-rank": r,
                         transform: "translate(" + (c.x - boxW / 2) + "," + (c.y - boxH / 2) + ")" }, nodes);
      svg("rect", { "class": "rlp-box", width: boxW, height: boxH, rx: 4 }, g);
      svg("text", { x: boxW / 2, y: 13, "class": "rlp-rank-label", "font-size": 11 }, g,
          n > d.detailLimit ? String(r) : "rank " + r);
      var mine = [];
      for (var k = 0; k < (mode === "detail" ? nChunks : rows); k++) {
        var x = 4 + (k % cols) * cell, y = 18 + Math.floor(k / cols) * cell;
        var rect = svg("rect", { "class": "rlp-cell", x: x, y: y, width: cell - 2, height: cell - 2,
                                 "data-chunk": mode === "detail" ? d.chunks[k] : "all" }, g);
        var tip = svg("title", {}, rect);
        var label = cell >= 16 && mode === "detail" ?
          svg("text", { x: x + cell / 2 - 1, y: y + cell / 2 + 3, "class": "rlp-count", "font-size": cell * 0.5 }, g) : null;
        if (chunkRow) svg("text", { x: x + cell / 2 - 1, y: y + cell + 7, "class": "rlp-chunk-label", "font-size": 7 }, g, "c" + d.chunks[k]);
        mine.push({ rect: rect, tip: tip, label: label });
      }
      self.cells.push(mine);
      // What the rank computes after this step (comm.compute), under its box.
      self.badges.push(svg("text", { x: boxW / 2, y: boxH + 12, "class": "rlp-compute",
                                     "font-size": 10 }, g));
    });
    this.arrows = svg("g", { "class": "rlp-arrows" }, s);
    this.buildControls();
    this.caption = el("div", { "class": "rlp-caption" }, this.root);
    this.list = el("ul", { "class": "rlp-messages" }, this.root);
    this.buildLegend(mode);
  };

  Player.prototype.buildControls = function () {
    var self = this, bar = el("div", { "class": "rlp-controls" }, this.root);
    function button(cls, text, title, action) {
      var b = el("button", { type: "button", "class": cls, title: title, "aria-label": title }, bar, text);
      b.addEventListener("click", action);
      return b;
    }
    button("rlp-first", "|◀", "first step", function () { self.pause(); self.show(0); });
    button("rlp-back", "◀", "step back", function () { self.pause(); self.show(self.step - 1); });
    this.playButton = button("rlp-play", "▶ play", "play / pause", function () { self.toggle(); });
    button("rlp-forward", "▶", "step forward", function () { self.pause(); self.show(self.step + 1); });
    button("rlp-last", "▶|", "last step", function () { self.pause(); self.show(self.d.steps); });
    this.slider = el("input", { type: "range", "class": "rlp-slider", min: 0, max: this.d.steps,
                                step: 1, value: 0, "aria-label": "step" }, bar);
    this.slider.addEventListener("input", function () { self.pause(); self.show(+self.slider.value); });
    this.stepText = el("span", { "class": "rlp-stepno" }, bar);
    var speed = el("select", { "class": "rlp-speed", title: "speed", "aria-label": "speed" }, bar);
    [0.5, 1, 2, 4].forEach(function (v) {
      var o = el("option", { value: v }, speed, v + "×");
      if (v === 1) o.selected = true;
    });
    speed.addEventListener("change", function () {
      self.speed = +speed.value;
      if (self.timer) { self.pause(); self.play(); }    // restart at the new pace
    });
    this.root.addEventListener("keydown", function (ev) {
      if (ev.target.tagName === "SELECT" || ev.target.tagName === "INPUT") return;
      if (ev.key === "ArrowRight") { self.pause(); self.show(self.step + 1); ev.preventDefault(); }
      if (ev.key === "ArrowLeft") { self.pause(); self.show(self.step - 1); ev.preventDefault(); }
    });
  };

  Player.prototype.buildLegend = function (mode) {
    var d = this.d, n = d.worldSize, legend = el("div", { "class": "rlp-legend" }, this.root);
    if (this.moveOnly) {
      el("span", {}, legend, "copy only: each chunk shows whose data it holds; ");
      var own = el("span", { "class": "rlp-swatch" }, legend, "r");
      own.style.background = OWN;
      el("span", {}, legend, " its own, ");
      for (var o = 0; o < Math.min(n, 4); o++) {
        el("span", { "class": "rlp-swatch" }, legend, String(o)).style.background = ORIGIN[o % ORIGIN.length];
      }
      el("span", {}, legend, (n > 4 ? " … rank 0's, 1's, …" : " rank 0's, 1's, …") +
                             (d.contributionMode === "copy" ? "; blank: nothing yet" : ""));
    } else if (mode !== "none") {
      el("span", {}, legend, mode === "detail" ? "chunk holds k of " + n + " contributions: " :
                             "share of all contributions a rank holds: ");
      var marks = n <= 8 ? Array.from({ length: n }, function (_, i) { return i + 1; }) :
        [1, Math.round(n / 2), n];
      marks.forEach(function (k) {
        var sw = el("span", { "class": "rlp-swatch" }, legend, mode === "detail" ? String(k) : Math.round(100 * k / n) + "%");
        sw.style.background = fillColour(n > 1 ? (k - 1) / (n - 1) : 1, k === n);
        if (k === n || (n > 1 && (k - 1) / (n - 1) > 0.55)) sw.style.color = "white";
      });
    } else if (d.note) {
      el("span", {}, legend, d.note + " ");
    }
    d.ops.forEach(function (op, i) {
      var key = el("span", { "class": "rlp-op" }, legend, "→ " + op);
      key.style.color = this.colours[i];
    }, this);
    if (mode === "detail") el("span", { "class": "rlp-hint" }, legend, "dashed: chunk sent; thick: chunk received");
    if (d.carried) el("span", { "class": "rlp-hint" }, legend, "arrow labels: what each message carried, read from its values");
    if (d.computes && d.computes.length) el("span", { "class": "rlp-hint" }, legend, "⚙ under a rank: it computes after this step");
    if (d.groups && d.groups.length) el("span", { "class": "rlp-hint" }, legend, "[group]: the process group a message is in");
  };

  Player.prototype.show = function (step) {
    var d = this.d;
    step = Math.max(0, Math.min(d.steps, step));
    this.step = step;
    this.slider.value = step;
    this.stepText.textContent = "step " + step + " / " + d.steps;
    this.paintCells(step);
    this.drawArrows(step);
    this.drawComputes(step);
    this.describe(step);
  };

  Player.prototype.paintCells = function (step) {
    var d = this.d, n = d.worldSize, nChunks = d.chunks.length, state = this.states && this.states[step];
    var moveOnly = this.moveOnly;
    if (!state) return;
    this.cells.forEach(function (mine, r) {
      mine.forEach(function (c, k) {
        var fill, text = "", dark = false, tip;
        if (d.holdings.mode === "aggregate") {   // one square: the share of all contributions
          var total = nChunks * n;
          tip = "rank " + r + " holds " + state[r] + " of " + total + " chunk contributions";
          fill = fillColour(n > 1 ? (state[r] - nChunks) / (total - nChunks) : 1, state[r] === total);
        } else {
          var who = ranksOf(state[r * nChunks + k]), count = who.length;
          tip = "rank " + r + ", chunk " + d.chunks[k] + ": contributions of rank" +
                (count > 1 ? "s " : " ") + who.join(", ") + " (" + count + " of " + n + ")";
          if (count === 0) {                     // nothing here yet (a gather's empty slot)
            tip = "rank " + r + ", chunk " + d.chunks[k] + ": nothing yet";
            fill = "#fff";
            text = "";
          } else if (moveOnly) {                 // whose data: its own (pale) or rank o's colour
            var origin = count === 1 ? who[0] : -1;
            text = count === 1 ? origin : count;
            fill = origin === r ? OWN : origin < 0 ? "#bbb" : ORIGIN[origin % ORIGIN.length];
          } else {                               // how many contributions
            text = count;
            dark = count === n || (n > 1 && (count - 1) / (n - 1) > 0.55);
            fill = fillColour(n > 1 ? (count - 1) / (n - 1) : 1, count === n);
          }
        }
        c.rect.setAttribute("fill", fill);
        c.rect.setAttribute("class", "rlp-cell");
        c.tip.textContent = tip;
        if (c.label) {
          c.label.textContent = text;
          c.label.setAttribute("fill", dark ? "white" : "#222");
        }
      });
    });
  };

  Player.prototype.drawArrows = function (step) {
    var d = this.d, g = this.geo, self = this, events = this.byStep[step];
    var detail = d.holdings && d.holdings.mode === "detail";
    while (this.arrows.firstChild) this.arrows.removeChild(this.arrows.firstChild);
    var labels = events.length <= 32 && d.worldSize <= d.detailLimit, seen = {};
    events.slice(0, MAX_ARROWS).forEach(function (e) {
      var a = g.centres[e[1]], b = g.centres[e[2]], chunk = e[3] < 0 ? "" : d.chunks[e[3]];
      var op = e[4] < 0 ? "" : d.ops[e[4]], colour = self.colours[e[4] < 0 ? d.ops.length : e[4]];
      var pair = e[1] + ">" + e[2], k = seen[pair] = (seen[pair] || 0) + 1;
      var dx = b.x - a.x, dy = b.y - a.y, len = Math.hypot(dx, dy) || 1, ux = dx / len, uy = dy / len;
      // Bow each arrow to the right of its direction: A->B and B->A never overlap,
      // and repeated messages between one pair (k > 1) bow further out.
      var nx = -uy, ny = ux, bend = Math.min(40, 0.18 * len) + 14 * (k - 1);
      // Leave each box at its edge, not its centre.
      var edge = Math.min(g.boxW / 2 / (Math.abs(ux) || 1e-9), g.boxH / 2 / (Math.abs(uy) || 1e-9)) + 3;
      var p0 = { x: a.x + ux * edge + nx * bend * 0.3, y: a.y + uy * edge + ny * bend * 0.3 };
      var p2 = { x: b.x - ux * edge + nx * bend * 0.3, y: b.y - uy * edge + ny * bend * 0.3 };
      var c = { x: (a.x + b.x) / 2 + nx * bend, y: (a.y + b.y) / 2 + ny * bend };
      var arrow = svg("g", { "class": "rlp-arrow", "data-step": e[0], "data-src": e[1], "data-dst": e[2],
                             "data-chunk": chunk, "data-op": op,
                             "data-carried": e[8] ? ranksOf(e[8][0]).join(",") : "" }, self.arrows);
      svg("path", { d: "M" + p0.x + "," + p0.y + " Q" + c.x + "," + c.y + " " + p2.x + "," + p2.y,
                    stroke: colour, "stroke-width": labels ? 2.2 : 1.2, fill: "none",
                    "marker-end": "url(#" + self.uid + "-head" + self.colours.indexOf(colour) + ")" }, arrow);
      svg("title", {}, arrow, self.messageText(e));
      if (labels) {                      // at the middle of the curve (t = 1/2)
        // Big worlds: just the chunk (the colour says the op), so labels fit between ranks.
        // Never shortened: an all-to-all's (src, dst) tuples are the point of its picture.
        var name = /^-?\d+$/.test(chunk) ? "c" + chunk : chunk;
        var text = e[8] ? self.carriedText(e, true) :
          chunk !== "" ? name + (op && d.worldSize <= 8 ? " " + op : "") : (op || e[5] + " B");
        var x = 0.25 * p0.x + 0.5 * c.x + 0.25 * p2.x, y = 0.25 * p0.y + 0.5 * c.y + 0.25 * p2.y + 4;
        // A tuple of tuples (an all-to-all's blocks "((0, 1), (0, 2))") would run into the
        // neighbouring labels on one line: one block per line instead, centred on the curve.
        var lines = !e[8] && /^\(\(/.test(chunk) ? chunk.match(/\([^()]*\)/g) : [text];
        var label = svg("text", { x: x, y: y - (lines.length - 1) * self.font * 0.55, "class": "rlp-arrow-label",
                                  fill: colour, "font-size": self.font }, arrow);
        lines.forEach(function (line, i) {
          svg("tspan", { x: x, dy: i ? "1.1em" : 0 }, label, line);
        });
      }
      if (detail && e[3] >= 0) {         // outline the chunks that left and the ones they landed in
        (e[8] ? e[8][1] : [e[3]]).forEach(function (k) {
          self.cells[e[1]][k].rect.setAttribute("class", "rlp-cell rlp-sent");
          self.cells[e[2]][k].rect.setAttribute("class", "rlp-cell rlp-got");
        });
      }
    });
  };

  // Simulated seconds, readably: 0.002 -> "2 ms".
  function seconds(t) {
    if (t >= 1) return +t.toPrecision(3) + " s";
    if (t >= 1e-3) return +(t * 1e3).toPrecision(3) + " ms";
    return +(t * 1e6).toPrecision(3) + " µs";
  }

  // "backward 2 ms" (and "on stream 1" for a compute inside a comm.start work).
  Player.prototype.computeText = function (c) {
    return this.d.computeLabels[c[2]] + " " + seconds(c[3]) + (c[4] ? " on stream 1" : "");
  };

  // Under each rank box: what it computes after this step; at most two named, then a count.
  Player.prototype.drawComputes = function (step) {
    var self = this, mine = this.badges.map(function () { return []; });
    this.computesByStep[step].forEach(function (c) { mine[c[1]].push(c); });
    this.badges.forEach(function (badge, r) {
      var list = mine[r], total = list.reduce(function (t, c) { return t + c[3]; }, 0);
      badge.textContent = !list.length ? "" : "⚙ " + (list.length <= 2 ?
        list.map(function (c) { return self.computeText(c); }).join(" + ") :
        list.length + " computes, " + seconds(total));
      badge.setAttribute("data-computes", list.length);
    });
  };

  // "rank 0 → rank 1: chunk 3, reduce, 16 B, ring_allreduce" (the span only if
  // the trace has several, as the title already names a single one).
  // What a message carried, read from its payload: "c2: 0+1+3" (a sum of those ranks'
  // inputs) or "c2: from 3" (a copy of rank 3's); long form for the message list.
  Player.prototype.carriedText = function (e, short) {
    var d = this.d, ranks = ranksOf(e[8][0]), cells = e[8][1];
    var name = cells.length > 1 ? d.chunks[cells[0]] + "–" + d.chunks[cells[cells.length - 1]] : d.chunks[cells[0]];
    if (d.contributionMode === "sum") {
      return short ? "c" + name + ": " + ranks.join("+") :
        "carries the sum of rank" + (ranks.length > 1 ? "s " : " ") + ranks.join(", ") + " (" + ranks.length + " of " + d.worldSize + ")";
    }
    return short ? "c" + name + ": from " + ranks.join(",") :
      "carries a copy of rank" + (ranks.length > 1 ? "s " : " ") + ranks.join(", ") + "'s data";
  };

  Player.prototype.messageText = function (e) {
    var d = this.d, parts = [];
    if (e[3] >= 0) parts.push("chunk " + d.chunks[e[3]]);
    if (e[4] >= 0) parts.push(d.ops[e[4]]);
    parts.push(e[5] + " B");
    if (d.spans.length > 1 && d.spans[e[6]]) parts.push(d.spans[e[6]]);
    if (e[8]) parts.push(this.carriedText(e, false));
    else if (d.carried) parts.push("not a sum or copy of the inputs");
    var group = e[7] >= 0 ? " [group " + d.groups[e[7]] + "]" : "";
    return "rank " + e[1] + " → rank " + e[2] + group + ": " + parts.join(", ");
  };

  Player.prototype.describe = function (step) {
    var d = this.d, events = this.byStep[step], self = this;
    var ops = {};
    events.forEach(function (e) { if (e[4] >= 0) ops[d.ops[e[4]]] = true; });
    var what = Object.keys(ops).length ? " (" + Object.keys(ops).join(", ") + ")" : "";
    var after = d.holdings ? " Colours: the chunks after this step." : "";
    this.caption.textContent = step === 0 ?
      "Start: nothing sent yet" + (d.holdings ? "; every rank holds only its own contribution." : ".") :
      "Step " + step + " of " + d.steps + ": " + events.length + " message" +
      (events.length === 1 ? "" : "s") + what + "." + after +
      (events.length > MAX_ARROWS ? " Drawing the first " + MAX_ARROWS + "." : "");
    while (this.list.firstChild) this.list.removeChild(this.list.firstChild);
    // Messages, then computes; at most MAX_LISTED lines in all, so the player keeps its height.
    var items = events.map(function (e) { return [{}, self.messageText(e)]; }).concat(
      this.computesByStep[step].map(function (c) {
        return [{ "class": "rlp-compute-item" }, "rank " + c[1] + " computes " + self.computeText(c)];
      }));
    var cut = items.length > MAX_LISTED ? MAX_LISTED - 1 : items.length;
    items.slice(0, cut).forEach(function (it) { el("li", it[0], self.list, it[1]); });
    if (cut < items.length) el("li", {}, this.list, "… and " + (items.length - cut) + " more");
  };

  Player.prototype.play = function () {
    var self = this;
    if (this.step >= this.d.steps) this.show(0);        // play again from the start
    this.playButton.textContent = "❚❚ pause";
    this.timer = setInterval(function () {
      // A re-run notebook cell removes the player: stop ticking then.
      if (!document.body.contains(self.root) || self.step >= self.d.steps) { self.pause(); return; }
      self.show(self.step + 1);
    }, BASE_MS / this.speed);
  };

  Player.prototype.pause = function () {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    this.playButton.textContent = "▶ play";
  };

  Player.prototype.toggle = function () { if (this.timer) this.pause(); else this.play(); };

  window.RinglabPlayer = {
    mount: function (root, data) { root.ringlabPlayer = new Player(root, data); return root.ringlabPlayer; }
  };
})();
