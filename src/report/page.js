// The report page: draws every section from the JSON in #pk-data with Plotly.
// Sets body[data-status] to "ok" when every plot has rendered, or to
// "error: ..." (the browser test reads it).
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("pk-data").textContent);
  const main = document.getElementById("pk-main");
  const pending = [];
  const config = { displaylogo: false, responsive: true };
  const palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                   "#bcbd22", "#17becf"];

  function el(tag, attrs, children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") e.textContent = v;
      else if (k === "class") e.className = v;
      else e.setAttribute(k, v);
    }
    for (const c of children || []) e.appendChild(typeof c === "string" ? document.createTextNode(c) : c);
    return e;
  }
  function section(id, title, note) {
    const s = el("section", { id: id }, [el("h2", { text: title })]);
    if (note) s.appendChild(el("p", { class: "note", text: note }));
    main.appendChild(s);
    return s;
  }
  function plot(parent, id, traces, layout, height) {
    const div = el("div", { id: id, class: "plot" });
    div.style.height = (height || 360) + "px";
    parent.appendChild(div);
    const base = { margin: { l: 60, r: 60, t: 30, b: 50 }, font: { size: 12 } };
    pending.push(Plotly.newPlot(div, traces, Object.assign(base, layout), config));
    return div;
  }
  function fmt(v, digits) {
    if (v === null || v === undefined) return "–";
    if (typeof v !== "number") return String(v);
    if (v !== 0 && (Math.abs(v) < 1e-3 || Math.abs(v) >= 1e5)) return v.toExponential(digits || 2);
    return Number(v.toPrecision(digits || 4)).toString();
  }
  const steps = data.training.step;
  const stepAxis = (n) => Array.from({ length: n }, (_, i) => i);

  // Header: what was run.
  const s0 = data.summary;
  const res = s0.results || {};
  const facts = [["data", s0.data], ["model", s0.model], ["optimizer", s0.optimizer + ", lr " + fmt(s0.lr) +
                 (s0.batch ? ", batch " + s0.batch : ", full batch")], ["steps", s0.steps],
                 ["parameters", s0.parameters], ["training / test points", s0.train + " / " + s0.test],
                 ["train / test accuracy", fmt(res.train_accuracy) + " / " + fmt(res.test_accuracy)],
                 ["status", s0.status], ["plots", data.plotting]];
  const table = el("table", { class: "facts", id: "pk-summary" },
                   facts.map(([k, v]) => el("tr", {}, [el("th", { text: k }), el("td", { text: String(v) })])));
  main.appendChild(table);

  // Training curves.
  {
    const s = section("training", "Training", "Loss and accuracy of each step's batch (metrics.csv).");
    plot(s, "plot-training", [
      { x: steps, y: data.training.loss, name: "loss", mode: "lines", line: { color: palette[0] } },
      { x: steps, y: data.training.batch_accuracy, name: "batch accuracy", mode: "lines", yaxis: "y2",
        line: { color: palette[1] } }],
      { xaxis: { title: "step" }, yaxis: { title: "loss" },
        yaxis2: { title: "accuracy", overlaying: "y", side: "right", range: [0, 1.02] },
        legend: { orientation: "h", y: 1.12 } });
  }

  // The kernel machine against the network (Fig. 4).
  {
    const km = data.kernel_machine;
    const s = section("kernel-machine", "The kernel machine against the network",
      "f(w_0, x) + Σ_i C_i(x) + R(x) + E(x) against f(w_N, x) on " + km.test_index.length +
      " test points, one colour per class (the paper's Fig. 4). Quadrature " + km.quadrature + ".");
    s.appendChild(el("p", { class: "headline", id: "pk-max-error",
      text: "max |kernel − network| = " + fmt(km.max_abs_error, 2) + "; max relative error (to max(1, |f|)) = " +
            fmt(km.max_rel_error, 2) }));
    const K = km.network[0].length;
    const traces = [];
    let lo = Infinity, hi = -Infinity;
    for (let k = 0; k < K; ++k) {
      const xs = km.network.map((r) => r[k]), ys = km.kernel.map((r) => r[k]);
      for (const v of xs) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
      traces.push({ x: xs, y: ys, mode: "markers", name: "class " + k, marker: { color: palette[k % 10], size: 7 },
                    text: km.test_index.map((i) => "test #" + i), hovertemplate: "%{text}<br>network %{x}<br>kernel %{y}" });
    }
    traces.push({ x: [lo, hi], y: [lo, hi], mode: "lines", name: "y = x", line: { color: "#999", dash: "dot" } });
    plot(s, "plot-scatter", traces, { xaxis: { title: "network f(w_N, x)" }, yaxis: { title: "kernel machine" } }, 420);
  }

  // Certificate gap and evaluations per step.
  {
    const st = data.steps;
    const n = st.certificate_gap.length;
    const s = section("certificate", "Certificate and evaluations per step",
      "The certificate |J̄_s(x) Δw_s − (f(w_{s+1}, x) − f(w_s, x))| / max(1, |f|), max over the test points, and " +
      "the integrand evaluations per test point at each step (mean " + fmt(st.mean_evaluations) + ").");
    const gap = st.certificate_gap.map((v) => Math.max(v, 1e-18));
    plot(s, "plot-certificate", [
      { x: stepAxis(n), y: gap, name: "certificate gap", mode: "lines", line: { color: palette[3] } },
      { x: stepAxis(n), y: st.evaluations, name: "evaluations / point", mode: "lines", yaxis: "y2",
        line: { color: palette[0] } }],
      { xaxis: { title: "step s" }, yaxis: { title: "certificate gap", type: "log", exponentformat: "power", dtick: 1 },
        yaxis2: { title: "evaluations", overlaying: "y", side: "right", rangemode: "tozero" },
        legend: { orientation: "h", y: 1.12 } });
  }

  // Explained test points: the input, proponents and opponents, per-step curves.
  {
    const s = section("explained", "Explained test points",
      data.points.length ? "Each test point beside the training points that pushed its predicted class up " +
        "(proponents) and down (opponents), with their contributions C_i(x). Hover or click a training point for " +
        "its index, label and per-step contribution curve."
        : "No explain output: run 'pathkernel explain RUN --test-index ...' and then the report again.");
    data.points.forEach((p, pi) => {
      const card = el("div", { class: "point", id: "point-" + p.test_index });
      const head = el("div", { class: "point-head" });
      head.appendChild(inputView(p.input, "test", "test-input"));
      head.appendChild(el("div", { class: "point-facts" }, [
        el("h3", { text: (p.source === "input" ? "input #" : "test #") + p.test_index }),
        el("p", { text: p.label === null ? "no label, predicted " + p.predicted
                  : "true class " + p.label + ", predicted " + p.predicted +
                    (p.label === p.predicted ? " (correct)" : " (wrong)") }),
        el("p", { class: "note", text: "completeness error " + fmt(p.completeness_error, 2) })]));
      card.appendChild(head);
      const detail = el("div", { class: "detail" });
      const detailText = el("p", { class: "detail-text", text: "Hover or click a training point." });
      const detailPlot = el("div", { class: "plot detail-plot", id: "curve-" + p.test_index });
      detailPlot.style.height = "240px";
      detail.appendChild(detailText);
      detail.appendChild(detailPlot);
      for (const side of ["proponents", "opponents"]) {
        const grid = el("div", { class: "grid " + side });
        grid.appendChild(el("h4", { text: side + " of class " + p.predicted }));
        const tiles = el("div", { class: "tiles" });
        p[side].forEach((t) => {
          const tile = el("div", { class: "tile " + side, tabindex: "0", "data-index": t.index });
          tile.appendChild(inputView(t.input, side, ""));
          tile.appendChild(el("div", { class: "caption", text: "#" + t.index + " · " + t.label }));
          tile.appendChild(el("div", { class: "value", text: (t.value >= 0 ? "+" : "") + fmt(t.value, 3) }));
          if (t.layers) tile.appendChild(layerBar(t));
          const show = () => showCurve(p, t, side, detailText, detailPlot);
          tile.addEventListener("mouseenter", show);
          tile.addEventListener("click", show);
          tile.addEventListener("focus", show);
          tiles.appendChild(tile);
        });
        grid.appendChild(tiles);
        card.appendChild(grid);
      }
      card.appendChild(detail);
      s.appendChild(card);
      if (p.proponents.length) showCurve(p, p.proponents[0], "proponents", detailText, detailPlot);
    });
  }
  // The exact contribution (the path held fixed) beside the metagradient (the path responding).
  if (data.views && data.views.length) {
    const s = section("views", "Exact contribution beside the metagradient",
      "Each training point's exact contribution C_i(x) (horizontal) against its metagradient d f(w_N, x)/d c_i " +
      "(vertical), for the output shown: where they agree the points lie on a line; points far along one axis " +
      "only matter to the decomposition (the path that happened) or to the counterfactual (retraining without " +
      "them), not to both.");
    data.views.forEach((v) => {
      const classes = Array.from(new Set(v.label)).sort((a, b) => a - b);
      const traces = classes.map((c) => {
        const idx = v.label.map((l, i) => (l === c ? i : -1)).filter((i) => i >= 0);
        return { type: "scatter", mode: "markers", name: "class " + c, marker: { size: 4 },
                 x: idx.map((i) => v.epk[i]), y: idx.map((i) => v.metagradient[i]),
                 text: idx.map((i) => "#" + i), hovertemplate: "%{text}<br>C_i %{x:.3g}<br>MG_i %{y:.3g}" };
      });
      plot(s, "plot-views-" + v.test_index, traces,
        { title: "test #" + v.test_index + ", output " + v.output + ": Spearman " + fmt(v.spearman, 3) +
                 ", Pearson " + fmt(v.pearson, 3),
          xaxis: { title: "exact contribution C_i(x)" }, yaxis: { title: "metagradient d f / d c_i" } }, 380);
    });
  }

  // pathkernel evaluate: the methods x metrics table and, per test point, each
  // method's predicted change against the actual change of retraining.
  if (data.evaluation) {
    const ev = data.evaluation;
    const loo = ev.loo;
    const s = section("evaluation", "Attributions against retraining",
      "From " + ev.dir + "/evaluate.json ('pathkernel evaluate', " + ev.test_points + " test points, output: " +
      ev.output + (ev.retrain ? "; " + ev.retrain.retrainings + " retrainings, removal " + ev.retrain.scaling : "") +
      "). The table is evaluate's: loo_* are means over the test points of each method's correlation with the " +
      "actual leave-one-out changes (loo_spearman_random: on the random points alone; loo_slope: the median " +
      "slope of the changes on the scores), lds the linear datamodeling score, mislabel_auc the area under the " +
      "ROC curve of finding flipped labels.");
    const head = el("tr", {}, [el("th", { text: "method" })].concat(ev.columns.map((c) => el("th", { text: c }))));
    const rows = ev.methods.map((mth) => el("tr", {}, [el("td", { text: mth })].concat(
      ev.columns.map((c) => el("td", { class: "num", text: fmt((ev.table[mth] || {})[c], 3) })))));
    s.appendChild(el("table", { class: "metrics", id: "pk-evaluate-table" }, [head].concat(rows)));
    if (!loo) {
      s.appendChild(el("p", { class: "note", text: "No leave-one-out in this evaluation, so no scatter: run " +
        "'pathkernel evaluate RUN --metrics loo' for it." }));
    } else {
      const capped = loo.per_test.some((t) => t.index.length < t.removed);
      s.appendChild(el("p", { class: "note", id: "pk-evaluate-note", text:
        "Per test point, each removed training point i: horizontal, the method's score (the change it predicts); " +
        "vertical, the actual change f(x) − f₋ᵢ(x) of the output when the run is retrained from w_0 with the same " +
        "batches minus point i. Removed: the " + loo.extremes + " top and bottom points of each test point by " +
        loo.selection_method + " (blue) and " + loo.random + " random points shared by the test points (orange). " +
        (loo.per_test.length < loo.tests ? "Showing the first " + loo.per_test.length + " of " + loo.tests +
          " test points (report --evaluate-tests). " : "") +
        (capped ? "Test points with more than " + loo.max_points + " removed points show " + loo.max_points +
          " of them, evenly spaced in the actual change (report --evaluate-points); the correlations in the " +
          "captions are evaluate's, over all of them." : "") }));
      loo.per_test.forEach((t, j) => {
        const M = ev.methods.length, cols = Math.min(M, 3), rows = Math.ceil(M / cols);
        const traces = [];
        const layout = { grid: { rows: rows, columns: cols, pattern: "independent", xgap: 0.12, ygap: 0.3 },
                         annotations: [], showlegend: j === 0, legend: { orientation: "h", y: -0.12 },
                         margin: { l: 60, r: 20, t: 45, b: 50 } };
        const hover = t.index.map((i) => "training #" + i);
        ev.methods.forEach((mth, q) => {
          const ax = q ? String(q + 1) : "";
          for (const random of [false, true]) {
            const pos = t.random.map((r, r0) => (r === random ? r0 : -1)).filter((r0) => r0 >= 0);
            traces.push({ type: "scatter", mode: "markers", xaxis: "x" + ax, yaxis: "y" + ax,
              name: random ? "random points" : "top and bottom by " + loo.selection_method,
              legendgroup: random ? "random" : "chosen", showlegend: q === 0,
              marker: { size: 6, color: random ? palette[1] : palette[0] },
              x: pos.map((r0) => t.scores[mth][r0]), y: pos.map((r0) => t.effect[r0]),
              text: pos.map((r0) => hover[r0]),
              hovertemplate: "%{text}<br>" + mth + " %{x:.3g}<br>actual %{y:.3g}<extra></extra>" });
          }
          layout["xaxis" + ax] = { title: { text: mth + " score", standoff: 4 }, zeroline: true };
          layout["yaxis" + ax] = { title: { text: q % cols === 0 ? "actual change" : "" }, zeroline: true };
          layout.annotations.push({ text: mth + ": Spearman " + fmt(t.spearman[mth], 3) + ", Pearson " +
            fmt(t.pearson[mth], 3), xref: "x" + ax + " domain", yref: "y" + ax + " domain", x: 0.5, y: 1.0,
            xanchor: "center", yanchor: "bottom", showarrow: false, font: { size: 12 } });
        });
        const box = el("div", { class: "evaluation-point", id: "evaluate-" + j });
        s.appendChild(box);
        plot(box, "plot-evaluate-" + j, traces, layout, 60 + rows * 260);
        box.appendChild(el("p", { class: "caption", id: "caption-evaluate-" + j, text:
          "test #" + t.test_index + ", output " + t.output + ", " + t.removed + " removed points" +
          (t.index.length < t.removed ? " (" + t.index.length + " drawn)" : "") + ": " +
          ev.methods.map((mth) => mth + " Spearman " + fmt(t.spearman[mth], 3) + ", Pearson " +
            fmt(t.pearson[mth], 3)).join("; ") }));
      });
    }
  }

  function inputView(input, kind, id) {
    if (input.png) {
      const img = el("img", { src: input.png, class: "digit " + kind, alt: kind + " image" });
      if (id) img.id = id;
      return img;
    }
    const div = el("div", { class: "features " + kind });
    if (id) div.id = id;
    const f = input.features;
    const w = 120, h = 48, lo = Math.min(0, ...f), hi = Math.max(0, ...f), span = hi - lo || 1;
    // A small bar sparkline of the feature values (first 64).
    const bars = f.map((v, i) => {
      const y0 = h * (hi - Math.max(v, 0)) / span, y1 = h * (hi - Math.min(v, 0)) / span;
      return '<rect x="' + (i * w / f.length) + '" y="' + y0 + '" width="' + Math.max(1, w / f.length - 0.5) +
             '" height="' + Math.max(0.5, y1 - y0) + '"/>';
    }).join("");
    div.innerHTML = '<svg width="' + w + '" height="' + h + '" viewBox="0 0 ' + w + " " + h + '">' + bars + "</svg>";
    div.title = input.dimensions + " features" + (input.dimensions > f.length ? " (first " + f.length + " shown)" : "");
    return div;
  }
  // explain --by-layer: which parameter tensors carried a training point's
  // contribution, a bar per tensor (width its share of Σ|parts|, green up,
  // red down), the largest named below.
  function layerParts(t) {
    return t.layers.map((v, j) => ({ name: (data.layer_tensors || [])[j] || "tensor " + j, value: v }));
  }
  function layerBar(t) {
    const parts = layerParts(t);
    const total = parts.reduce((a, q) => a + Math.abs(q.value), 0) || 1;
    const div = el("div", { class: "layers" });
    const w = 64, h = 8;
    let x = 0;
    const rects = parts.map((q, j) => {
      const width = w * Math.abs(q.value) / total;
      const r = '<rect x="' + x + '" y="0" width="' + width + '" height="' + h + '" fill="' +
                (q.value >= 0 ? palette[2] : palette[3]) + '" fill-opacity="' + (1 - 0.6 * (j % 2)) + '"/>';
      x += width;
      return r;
    }).join("");
    div.innerHTML = '<svg width="' + w + '" height="' + h + '">' + rects + "</svg>";
    const top = parts.slice().sort((a, b) => Math.abs(b.value) - Math.abs(a.value))[0];
    div.appendChild(el("div", { class: "caption", text: top.name + " " + Math.round(100 * Math.abs(top.value) / total) + "%" }));
    div.title = parts.map((q) => q.name + ": " + fmt(q.value, 3)).join("\n");
    return div;
  }
  function showCurve(p, t, side, text, div) {
    text.textContent = "training #" + t.index + ", label " + t.label + ", " + side.slice(0, -1) +
      ": contribution " + fmt(t.value, 4) + " to class " + p.predicted + " (per-step terms sum to " +
      fmt(t.per_step.reduce((a, b) => a + b, 0), 4) + ")" +
      (t.layers ? "; by parameter tensor: " + layerParts(t).map((q) => q.name + " " + fmt(q.value, 3)).join(", ") : "");
    let acc = 0;
    const cum = t.per_step.map((v) => (acc += v));
    const x = stepAxis(t.per_step.length);
    const colour = side === "proponents" ? "#2ca02c" : "#d62728";
    const traces = [
      { x: x, y: t.per_step, type: "bar", name: "step s term C_{i,s}(x)", marker: { color: colour } },
      { x: x, y: cum, mode: "lines", name: "cumulative", yaxis: "y2", line: { color: "#333" } }];
    const layout = { margin: { l: 60, r: 60, t: 10, b: 40 }, xaxis: { title: "step s" },
                     yaxis: { title: "term" }, yaxis2: { title: "cumulative", overlaying: "y", side: "right" },
                     legend: { orientation: "h", y: 1.15 }, bargap: 0 };
    if (div.dataset.drawn) Plotly.react(div, traces, layout, config);
    else { div.dataset.drawn = "1"; pending.push(Plotly.newPlot(div, traces, layout, config)); }
  }

  // Contribution mass over steps.
  {
    const s = section("mass", "Contribution mass over steps",
      "Σ_i |C_{i,s}(x)| for the predicted class of each test point: which steps of training moved the prediction. " +
      "Right: the cumulative share of that mass.");
    const traces = [];
    data.mass.forEach((m, j) => {
      const x = stepAxis(m.abs.length);
      const total = m.abs.reduce((a, b) => a + b, 0) || 1;
      let acc = 0;
      traces.push({ x: x, y: m.abs, mode: "lines", name: "test #" + m.test_index, legendgroup: "t" + j,
                    line: { color: palette[j % 10], width: 1 } });
      traces.push({ x: x, y: m.abs.map((v) => (acc += v) / total), mode: "lines", xaxis: "x2", yaxis: "y2",
                    showlegend: false, legendgroup: "t" + j, line: { color: palette[j % 10], width: 1 } });
    });
    plot(s, "plot-mass", traces, {
      grid: { rows: 1, columns: 2, pattern: "independent" },
      xaxis: { title: "step s" }, yaxis: { title: "Σ_i |C_{i,s}(x)|" },
      xaxis2: { title: "step s" }, yaxis2: { title: "cumulative share", range: [0, 1.02] } }, 380);
  }

  // DPK against EPK along training (Fig. 2).
  {
    const a = data.dpk_angle;
    const s = section("dpk", "DPK against EPK along training",
      "The angle between the EPK's test gradient J̄_s(x) (integrated along the step) and the DPK's J(w_s, x) " +
      "(its start), per test point and step (the paper's Fig. 2).");
    const traces = a.degrees.map((row, j) => ({ x: stepAxis(row.length), y: row.map((v) => Math.max(v, 1e-9)),
      mode: "lines", name: "test #" + a.test_index[j], line: { color: palette[j % 10], width: 1 } }));
    plot(s, "plot-angle", traces, { xaxis: { title: "step s" },
      yaxis: { title: "angle (degrees)", type: "log", exponentformat: "power", dtick: 1 } });
  }

  // Gram matrix.
  if (data.gram) {
    const g = data.gram;
    const s = section("gram", "Gram matrix",
      "EPK between " + g.index.length + " class-balanced training points sorted by class: Σ_s tr(J(w_s, x) " +
      "J(w_s, x')ᵀ) / K.");
    const names = g.index.map((i, j) => "#" + i + " (" + g.label[j] + ")");
    plot(s, "plot-gram", [{ z: g.values, x: names, y: names, type: "heatmap", colorscale: "Viridis",
      hovertemplate: "%{y} × %{x}<br>%{z}<extra></extra>" }],
      { yaxis: { autorange: "reversed", showticklabels: false, title: "training point (by class)" },
        xaxis: { showticklabels: false, title: "training point (by class)" } }, 520);
  }

  // 2-D data: kernel and GP maps (Fig. 5).
  if (data.maps) {
    const m = data.maps;
    const s = section("maps", "Kernel and GP-uncertainty maps",
      "Left: the mean EPK value between each grid point and the training points. Right: GP regression of the " +
      "network's outputs on that kernel; the standard deviation of the class probabilities (the paper's Fig. 5).");
    const pts = (xa, ya) => ({ x: m.train_x, y: m.train_y, mode: "markers", xaxis: xa, yaxis: ya, showlegend: false,
      marker: { size: 4, color: m.train_label.map((l) => palette[l % 10]), line: { color: "white", width: 0.5 } } });
    plot(s, "plot-maps", [
      { z: m.kernel_value, x: m.x, y: m.y, type: "heatmap", colorscale: "Viridis", colorbar: { x: 0.45, len: 0.9 } },
      pts("x", "y"),
      { z: m.prob_std, x: m.x, y: m.y, type: "heatmap", colorscale: "Viridis", xaxis: "x2", yaxis: "y2",
        colorbar: { x: 1.0, len: 0.9 } },
      pts("x2", "y2")],
      { grid: { rows: 1, columns: 2, pattern: "independent" }, xaxis: { title: "x₁" }, yaxis: { title: "x₂" },
        xaxis2: { title: "x₁" }, yaxis2: { title: "x₂" } }, 460);
  }

  // The manifest.
  {
    const s = section("manifest", "Manifest");
    const d = el("details", { id: "pk-manifest" }, [el("summary", { text: "manifest.json of " + data.run }),
      el("pre", { text: JSON.stringify(data.manifest, null, 2) })]);
    s.appendChild(d);
  }

  Promise.all(pending).then(() => {
    document.body.dataset.plots = String(document.querySelectorAll(".js-plotly-plot").length);
    const errors = window.__pkErrors || [];
    document.body.dataset.status = errors.length ? "error: " + errors.join(" | ") : "ok";
  }, (e) => { document.body.dataset.status = "error: " + e; });
})();
