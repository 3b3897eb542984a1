/* ringlab trace player: draws one trace, one step at a time.
 *
 * Every rank is a box (placed by Python: ring, tree, line or circle) holding its
 * buffer as chunk cells, coloured by how many ranks' contributions the chunk
 * holds after the step. Every message of the step is an arrow labelled with its
 * chunk and op. Plain JavaScript and SVG, no libraries, no network: the same code
 * runs in a notebook output, in the built book and in a saved .html file.
 * Python (ringlab/show/player/__init__.py) builds `data`; see player_data() there.
 *
 * Two more views show the strategy, when the trace has their data (buttons switch;
 * ringlab/show/player/strategy.py builds it): "lanes", per rank and stream a
 * timeline of its computes and spans, lit while the step's messages are theirs;
 * "memory", per rank the bytes held under each label over the steps, stacked.
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
  var PANE_WIDTH = 760;                  // lanes and memory: drawn in px, at most this wide
  var PANE_HEIGHT = 430;                 // ... and at most about this tall
  var VIEW_NAMES = { messages: "messages", lanes: "lanes", memory: "memory" };

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
    // The view switch, when there is one, takes its height from the drawing's.
    var most = MAX_SHOWN_HEIGHT - ((d.views || []).length > 1 ? 30 : 0);
    var shownWidth = Math.min(760, Math.max(w * 1.25, 480), most * w / h);
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

    var views = d.views || ["messages"];
    this.view = d.view || "messages";
    this.root.setAttribute("data-view", this.view);
    if (views.length > 1) this.buildViewSwitch(views);
    this.panes = {};
    var ring = this.panes.messages = el("div", { "class": "rlp-pane", "data-pane": "messages" }, this.root);
    var s = svg("svg", { "class": "rlp-svg", viewBox: geo.viewBox.join(" "), role: "img",
                         "aria-label": d.title, style: "max-width:" + geo.shownWidth + "px" }, ring);
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
    if (d.lanes) this.buildLanes(this.panes.lanes = el("div", { "class": "rlp-pane", "data-pane": "lanes" }, this.root));
    if (d.memory) this.buildMemory(this.panes.memory = el("div", { "class": "rlp-pane", "data-pane": "memory" }, this.root));
    this.buildControls();
    this.caption = el("div", { "class": "rlp-caption" }, this.root);
    this.list = el("ul", { "class": "rlp-messages" }, this.root);
    this.buildLegend(mode);
    this.setView(this.view, true);
  };

  // One button per view the trace has data for; the pressed one is shown.
  Player.prototype.buildViewSwitch = function (views) {
    var self = this, bar = el("div", { "class": "rlp-views", role: "group", "aria-label": "view" }, this.root);
    el("span", { "class": "rlp-views-label" }, bar, "view:");
    this.viewButtons = {};
    views.forEach(function (v) {
      var b = el("button", { type: "button", "class": "rlp-view", "data-view": v,
                             title: "show the " + VIEW_NAMES[v] + " view" }, bar, VIEW_NAMES[v] || v);
      b.addEventListener("click", function () { self.setView(v); });
      self.viewButtons[v] = b;
    });
  };

  Player.prototype.setView = function (view, building) {
    if (!this.panes[view]) view = "messages";
    this.view = view;
    this.root.setAttribute("data-view", view);
    for (var v in this.panes) this.panes[v].style.display = v === view ? "" : "none";
    for (var b in this.viewButtons || {}) this.viewButtons[b].setAttribute("aria-pressed", b === view ? "true" : "false");
    this.legend.style.display = view === "messages" ? "" : "none";
    if (!building) this.show(this.step);
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
    var d = this.d, n = d.worldSize, legend = this.legend = el("div", { "class": "rlp-legend" }, this.root);
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
    if (this.view === "lanes") this.drawLanes(step);
    else if (this.view === "memory") this.drawMemory(step);
    else {
      this.paintCells(step);
      this.drawArrows(step);
      this.drawComputes(step);
    }
    this.describe(step);
  };

  // -- lanes: per rank and stream, what it ran, as a timeline ---------------------------------
  Player.prototype.buildLanes = function (pane) {
    var L = this.d.lanes, self = this, n = this.d.worldSize;
    var subrows = L.rows.reduce(function (t, r) { return t + r[2]; }, 0);
    var ranks = L.rows.filter(function (r, i) { return i === 0 || L.rows[i - 1][0] !== r[0]; }).length;
    var gap = L.rows.length > 24 ? 1 : 4, room = PANE_HEIGHT - 40 - gap * L.rows.length - (L.parts ? 15 * ranks : 0);
    var sub = Math.max(5, Math.min(18, Math.floor(room / subrows)));
    var labelW = 64, plotW = PANE_WIDTH - labelW - 12, partH = L.parts ? 15 : 0;
    var scale = plotW / L.end, y = 4, tops = [];
    L.rows.forEach(function (r, i) {
      if (i === 0 || L.rows[i - 1][0] !== r[0]) y += partH;    // a line for what the rank holds
      tops.push(y);
      y += r[2] * sub + gap;
    });
    var height = y + 30;
    var s = svg("svg", { "class": "rlp-svg rlp-lanes", viewBox: "0 0 " + PANE_WIDTH + " " + height,
                         role: "img", "aria-label": "lanes: " + this.d.title,
                         style: "max-width:" + PANE_WIDTH + "px" }, pane);
    this.laneGeo = { x0: labelW, scale: scale, top: 4, bottom: y - gap, sub: sub };
    L.rows.forEach(function (r, i) {
      var first = i === 0 || L.rows[i - 1][0] !== r[0], mid = tops[i] + r[2] * sub / 2;
      if (first && i > 0) svg("line", { "class": "rlp-lane-sep", x1: 0, x2: PANE_WIDTH, y1: tops[i] - partH - gap / 2,
                                        y2: tops[i] - partH - gap / 2 }, s);
      var label = (first ? (n > self.d.detailLimit ? String(r[0]) : "rank " + r[0]) : "") + (r[1] ? (first ? " · " : "") + "stream " + r[1] : "");
      svg("text", { x: 4, y: mid + 4, "class": "rlp-lane-label",
                    "font-size": Math.min(11, sub), "data-rank": r[0], "data-stream": r[1] }, s, label);
      if (first && L.parts) {
        svg("text", { x: labelW, y: tops[i] - 4, "class": "rlp-lane-part", "font-size": 11, "data-rank": r[0] }, s,
            "holds " + L.parts[r[0]]);
      }
      svg("rect", { "class": "rlp-lane", x: labelW, y: tops[i], width: plotW, height: r[2] * sub }, s);
    });
    var g = svg("g", { "class": "rlp-items" }, s);
    this.laneItems = L.items.map(function (it) {
      var row = L.rows[it[0]], yy = tops[it[0]] + it[1] * sub + 1, x = labelW + it[2] * scale;
      var w = Math.max(it[3] > it[2] ? 1 : 6, (it[3] - it[2]) * scale);
      var node = svg("g", { "class": "rlp-item", "data-rank": row[0], "data-stream": row[1], "data-depth": it[1],
                            "data-text": L.texts[it[7]], "data-at": it[4] }, g);
      var rect = svg("rect", { x: it[3] > it[2] ? x : x - 3, y: yy, width: w, height: sub - 2, rx: 2,
                               fill: L.colours[it[6]] }, node);
      svg("title", {}, node, L.titles[it[8]]);
      var text = L.texts[it[7]], label = sub >= 11 ? svg("text", { x: x + w / 2, y: yy + sub / 2 + 3, "class": "rlp-item-label",
                                                                    "font-size": Math.min(11, sub - 3) }, node, text) : null;
      if (label) label.setAttribute("fill", dark(L.colours[it[6]]) ? "white" : "#222");
      return { it: it, node: node, rect: rect, label: label, x: x, w: w, text: text };
    });
    // The step's column (steps on the x axis), over the boxes; or the time reached, a line.
    this.band = svg("rect", { "class": "rlp-band rlp-mem-band", y: 2, height: y - gap, width: 0, x: labelW }, s);
    this.cursorLine = svg("line", { "class": "rlp-cursor", x1: 0, x2: 0, y1: 2, y2: y - gap }, s);
    var unit = L.time ? seconds(L.end) : L.end + " step" + (L.end === 1 ? "" : "s");
    svg("text", { x: labelW, y: y + 10, "class": "rlp-axis", "font-size": 10 }, s, "0");
    svg("text", { x: labelW + plotW, y: y + 10, "class": "rlp-axis rlp-axis-end", "font-size": 10 }, s, unit);
    svg("text", { x: labelW + plotW / 2, y: y + 10, "class": "rlp-axis rlp-axis-mid", "font-size": 10 }, s,
        L.time ? "simulated time →" : "steps →");
    var legend = el("div", { "class": "rlp-legend rlp-lanes-legend" }, pane);
    L.legend.forEach(function (l) {
      var key = el("span", { "class": "rlp-key" }, legend);
      el("span", { "class": "rlp-swatch" }, key, "\u00a0").style.background = L.colours[l[0]];
      el("span", {}, key, " " + l[1]);
    });
    el("span", { "class": "rlp-hint" }, legend, L.cursor ? "drawn up to the time the step's messages reach; outlined: running in this step" :
                                        "drawn after the step it starts in; outlined: its messages are this step's");
  };

  // Dark fill -> white text (a rough luminance).
  function dark(hex) {
    if (!/^#[0-9a-f]{6}$/i.test(hex)) return false;
    var v = [1, 3, 5].map(function (i) { return parseInt(hex.substr(i, 2), 16); });
    return 0.299 * v[0] + 0.587 * v[1] + 0.114 * v[2] < 140;
  }

  Player.prototype.drawLanes = function (step) {
    var L = this.d.lanes, g = this.laneGeo, cursor = L.cursor ? L.cursor[step] : null;
    this.laneItems.forEach(function (o) {
      var it = o.it, shown = it[4] <= step, w = o.w;
      if (shown && cursor !== null && it[3] > it[2]) {   // up to the time reached
        w = Math.min(o.w, (cursor - it[2]) * g.scale);
        shown = w > 0;
      }
      o.node.setAttribute("data-shown", shown ? "1" : "0");
      o.node.setAttribute("data-lit", shown && step > 0 && it[4] <= step && step <= it[5] ? "1" : "0");
      o.node.style.display = shown ? "" : "none";
      if (!shown) return;
      o.rect.setAttribute("width", Math.max(w, 1));
      o.node.setAttribute("class", "rlp-item" + (o.node.getAttribute("data-lit") === "1" ? " rlp-lit" : ""));
      if (o.label) {
        o.label.setAttribute("x", o.x + w / 2);
        o.label.style.display = w >= 6.5 * o.text.length + 4 ? "" : "none";
      }
    });
    if (cursor !== null) {
      var x = g.x0 + cursor * g.scale;
      this.cursorLine.setAttribute("x1", x); this.cursorLine.setAttribute("x2", x);
      this.cursorLine.style.display = "";
      this.band.style.display = "none";
    } else {
      this.cursorLine.style.display = "none";
      if (!L.time && step > 0) {                  // steps: the band of this step's messages
        this.band.setAttribute("x", g.x0 + (step - 1) * g.scale);
        this.band.setAttribute("width", g.scale);
        this.band.style.display = "";
      } else this.band.style.display = "none";
    }
  };

  // -- memory: per rank, the bytes held under each label, step by step ---------------------------
  Player.prototype.buildMemory = function (pane) {
    var M = this.d.memory, n = this.d.worldSize, steps = this.d.steps, nl = M.labels.length;
    // frames[s][r * nl + k]: bytes after step s, summed from the deltas.
    var now = new Array(n * nl).fill(0), byStep = [];
    for (var s0 = 0; s0 <= steps; s0++) byStep.push([]);
    M.deltas.forEach(function (dl) { byStep[dl[0]].push(dl); });
    this.memFrames = byStep.map(function (list) {
      list.forEach(function (dl) { now[dl[1] * nl + dl[2]] += dl[3]; });
      return now.slice();
    });
    var top = Math.max(M.max, Math.max.apply(null, M.peak), 1);
    var rowH = Math.max(12, Math.min(58, Math.floor((PANE_HEIGHT - 30) / n))), labelW = 58;
    var chartW = 400, barX = labelW + chartW + 14, barW = 170;
    var height = n * rowH + 24;
    var sv = svg("svg", { "class": "rlp-svg rlp-memory", viewBox: "0 0 " + PANE_WIDTH + " " + height,
                          role: "img", "aria-label": "memory: " + this.d.title,
                          style: "max-width:" + PANE_WIDTH + "px" }, pane);
    var cw = chartW / (steps + 1), hh = rowH - 6;
    this.memGeo = { cw: cw, x0: labelW, barX: barX, barW: barW, top: top };
    this.memRows = [];
    for (var r = 0; r < n; r++) {
      var y0 = r * rowH, base = y0 + rowH - 3;
      svg("text", { x: 4, y: y0 + rowH / 2 + 4, "class": "rlp-lane-label", "font-size": Math.min(11, rowH - 1) }, sv,
          n > this.d.detailLimit ? String(r) : "rank " + r);
      svg("line", { "class": "rlp-mem-axis", x1: labelW, x2: labelW + chartW, y1: base, y2: base }, sv);
      // One step-shaped area per label, stacked in the order of first alloc.
      var below = new Array(steps + 1).fill(0);
      for (var k = 0; k < nl; k++) {
        var upper = [], pts = [];
        for (var s1 = 0; s1 <= steps; s1++) upper.push(below[s1] + this.memFrames[s1][r * nl + k]);
        var yOf = function (v) { return base - hh * v / top; };
        for (var s2 = 0; s2 <= steps; s2++) pts.push((labelW + s2 * cw) + "," + yOf(upper[s2]), (labelW + (s2 + 1) * cw) + "," + yOf(upper[s2]));
        for (var s3 = steps; s3 >= 0; s3--) pts.push((labelW + (s3 + 1) * cw) + "," + yOf(below[s3]), (labelW + s3 * cw) + "," + yOf(below[s3]));
        if (upper.some(function (v, i) { return v !== below[i]; })) {
          var area = svg("polygon", { points: pts.join(" "), fill: M.colours[k], "class": "rlp-mem-area",
                                      "data-rank": r, "data-label": M.labels[k] }, sv);
          svg("title", {}, area, "rank " + r + ": " + M.labels[k]);
        }
        below = upper;
      }
      var bars = M.labels.map(function (label, k) {
        var rect = svg("rect", { "class": "rlp-mem-now", y: y0 + 3, height: rowH - 6, x: barX, width: 0,
                                 fill: M.colours[k], "data-rank": r, "data-label": label, "data-bytes": 0 }, sv);
        return { rect: rect, tip: svg("title", {}, rect) };
      });
      svg("rect", { "class": "rlp-mem-frame", x: barX, y: y0 + 3, width: barW, height: rowH - 6 }, sv);
      var px = barX + barW * M.peak[r] / top;
      svg("line", { "class": "rlp-mem-peak", x1: px, x2: px, y1: y0 + 1, y2: y0 + rowH - 1 }, sv);
      var total = svg("text", { x: barX + barW + 6, y: y0 + rowH / 2 + 4, "class": "rlp-mem-total",
                                "font-size": Math.min(11, rowH - 1), "data-rank": r }, sv);
      this.memRows.push({ bars: bars, total: total });
    }
    // The current step's column, over the areas.
    this.memBand = svg("rect", { "class": "rlp-band rlp-mem-band", y: 0, height: n * rowH, width: cw, x: labelW }, sv);
    svg("text", { x: labelW, y: n * rowH + 14, "class": "rlp-axis", "font-size": 10 }, sv, "step 0");
    svg("text", { x: labelW + chartW, y: n * rowH + 14, "class": "rlp-axis rlp-axis-end", "font-size": 10 }, sv, "step " + steps);
    svg("text", { x: barX, y: n * rowH + 14, "class": "rlp-axis", "font-size": 10 }, sv, "after this step");
    svg("text", { x: barX + barW, y: n * rowH + 14, "class": "rlp-axis rlp-axis-end", "font-size": 10 }, sv, bytes(top));
    var legend = el("div", { "class": "rlp-legend rlp-memory-legend" }, pane);
    M.labels.forEach(function (label, k) {
      var key = el("span", { "class": "rlp-key" }, legend);
      el("span", { "class": "rlp-swatch" }, key, "\u00a0").style.background = M.colours[k];
      el("span", {}, key, " " + label);
    });
    el("span", { "class": "rlp-hint" }, legend, "held after each step (comm.alloc/free); dashed: the rank's peak, " +
                                            "also within a step");
  };

  // Bytes, readably, as ringlab.show.memory.format_bytes: 16000 -> "16 kB".
  function bytes(b) {
    var units = [[1e9, "GB"], [1e6, "MB"], [1e3, "kB"]];
    for (var i = 0; i < units.length; i++) if (b >= units[i][0]) return +(b / units[i][0]).toPrecision(4) + " " + units[i][1];
    return b + " B";
  }

  Player.prototype.drawMemory = function (step) {
    var M = this.d.memory, g = this.memGeo, nl = M.labels.length, frame = this.memFrames[step];
    this.memBand.setAttribute("x", g.x0 + step * g.cw);
    this.memRows.forEach(function (row, r) {
      var x = g.barX, total = 0, parts = [];
      row.bars.forEach(function (b, k) {
        var v = frame[r * nl + k], w = g.barW * v / g.top;
        b.rect.setAttribute("x", x); b.rect.setAttribute("width", w); b.rect.setAttribute("data-bytes", v);
        b.tip.textContent = "rank " + r + ", after step " + step + ": " + M.labels[k] + " " + bytes(v);
        x += w; total += v;
        if (v) parts.push(M.labels[k] + " " + bytes(v));
      });
      row.total.textContent = bytes(total);
      row.total.setAttribute("data-bytes", total);
      var tip = row.total.querySelector("title") || svg("title", {}, row.total);
      tip.textContent = parts.join(", ") || "nothing";
    });
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
    var after = d.holdings && this.view === "messages" ? " Colours: the chunks after this step." : "";
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
    // One line each (a long one ends in "…"; its tooltip has it whole), so the list keeps its height.
    items.slice(0, cut).forEach(function (it) {
      var li = el("li", it[0], self.list, it[1]);
      li.title = it[1];
    });
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
