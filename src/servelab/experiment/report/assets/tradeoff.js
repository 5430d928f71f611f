/* servelab report: interactive trade-off charts (uPlot, inlined; nothing is fetched).
   Reads the JSON in #tradeoff-data (experiment/tradeoff.py), draws latency vs throughput per
   latency metric with the SLO limits as red dashed lines, and tok/s per user vs tok/s per GPU
   with each arm's Pareto front. The checkboxes show/hide arms and percentiles on every chart;
   a URL hash `#toggle=arm:NAME,stat:p99` clicks those boxes at load (for tests and links). */
(function () {
  var el = document.getElementById('tradeoff-data');
  if (!el || typeof uPlot === 'undefined') { document.body.setAttribute('data-charts-rendered', 'error'); return; }
  var D = JSON.parse(el.textContent);
  var COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b', '#e377c2', '#17becf'];
  var DASH = { median: [], p95: [8, 4], p99: [2, 3] };
  var WIDTH = { median: 2.5, p95: 1.8, p99: 1.4 };
  var on = { arm: {}, stat: {} };
  D.arms.forEach(function (a) { on.arm[a] = true; });
  D.stats.forEach(function (s) { on.stat[s.key] = true; });
  var charts = [];
  function color(arm) { return COLORS[D.arms.indexOf(arm) % COLORS.length]; }
  function fmt(v, d) { return v == null ? '-' : (+v).toFixed(d); }

  // uPlot wants one ascending x array; every series gets null where it has no point
  function aligned(xOf, series) {
    var xs = [];
    D.points.forEach(function (p) { var x = xOf(p); if (x != null && xs.indexOf(x) < 0) xs.push(x); });
    series.forEach(function (s) { (s.extraX || []).forEach(function (x) { if (xs.indexOf(x) < 0) xs.push(x); }); });
    xs.sort(function (a, b) { return a - b; });
    var data = [xs];
    series.forEach(function (s) {
      var ys = xs.map(function () { return null; });
      s.pairs.forEach(function (xy) { var i = xs.indexOf(xy[0]); if (i >= 0 && xy[1] != null) ys[i] = xy[1]; });
      data.push(ys);
    });
    return data;
  }

  function sloHook(lines) {
    return function (u) {
      var ctx = u.ctx;
      var x0 = u.valToPos(u.scales.x.min, 'x', true), x1 = u.valToPos(u.scales.x.max, 'x', true);
      var yTop = u.valToPos(u.scales.y.max, 'y', true), yBot = u.valToPos(u.scales.y.min, 'y', true);
      lines.forEach(function (l) {
        var y = u.valToPos(l.ms, 'y', true);
        if (y < yTop || y > yBot) return;
        ctx.save(); ctx.strokeStyle = '#c00'; ctx.lineWidth = 2 * devicePixelRatio;
        ctx.setLineDash([10 * devicePixelRatio, 5 * devicePixelRatio]);
        ctx.beginPath(); ctx.moveTo(x0, y); ctx.lineTo(x1, y); ctx.stroke();
        ctx.setLineDash([]); ctx.fillStyle = '#c00'; ctx.textAlign = 'left'; ctx.textBaseline = 'bottom'; ctx.font = (12 * devicePixelRatio) + 'px sans-serif';
        ctx.fillText(l.label, x0 + 6 * devicePixelRatio, y - 4 * devicePixelRatio); ctx.restore();
      });
    };
  }

  // each arm's median capacity bracket (offered req/s) as a band in its colour; open: to the edge
  function capacityHook(u) {
    var ctx = u.ctx, caps = D.capacity || {};
    var yTop = u.valToPos(u.scales.y.max, 'y', true), yBot = u.valToPos(u.scales.y.min, 'y', true);
    Object.keys(caps).forEach(function (arm) {
      if (!on.arm[arm]) return;
      var lo = caps[arm][0], hi = caps[arm][1] == null ? u.scales.x.max : caps[arm][1];
      if (!(lo > 0)) return;
      var x0 = u.valToPos(Math.max(lo, u.scales.x.min), 'x', true);
      var x1 = u.valToPos(Math.min(hi, u.scales.x.max), 'x', true);
      ctx.save(); ctx.globalAlpha = 0.12; ctx.fillStyle = color(arm);
      ctx.fillRect(x0, yTop, Math.max(x1 - x0, 2 * devicePixelRatio), yBot - yTop); ctx.restore();
    });
  }

  function make(target, title, xLabel, yLabel, series, data, extra) {
    var box = document.createElement('div'); box.className = 'chart'; target.appendChild(box);
    var opts = {
      title: title, width: 520, height: 320,
      scales: { x: { time: false }, y: extra.yRange ? { range: extra.yRange } : {} },
      axes: [{ label: xLabel }, { label: yLabel, size: 60 }],
      series: [{ label: xLabel, value: function (u, v) { return fmt(v, 3); } }].concat(series.map(function (s) { return s.opts; })),
      hooks: extra.hooks || {},
      legend: { live: true }
    };
    var u = new uPlot(opts, data, box);
    u._meta = series.map(function (s) { return s.meta; });
    box.setAttribute('data-series', series.length);
    charts.push({ u: u, box: box });
    return u;
  }

  // the curve: a running median over `w` neighbours in throughput order (w = the arm's sweeps
  // pooled, so the noise between repetitions does not zig-zag the line); raw p50 as dots
  function smooth(pairs, w) {
    var ok = pairs.filter(function (xy) { return xy[0] != null && xy[1] != null; })
      .sort(function (a, b) { return a[0] - b[0]; });
    var h = Math.floor((w || 1) / 2);
    return ok.map(function (xy, i) {
      var ys = ok.slice(Math.max(0, i - h), i + h + 1).map(function (p) { return p[1]; }).sort(function (a, b) { return a - b; });
      var m = ys.length >> 1;
      return [xy[0], ys.length % 2 ? ys[m] : (ys[m - 1] + ys[m]) / 2];
    });
  }

  function latencyCharts(target) {
    D.latencies.forEach(function (L) {
      var series = [];
      D.arms.forEach(function (arm) {
        var mine = D.points.filter(function (p) { return p.arm === arm; });
        D.stats.forEach(function (st) {
          var pairs = mine.map(function (p) { return [p.req_s, p[L.key + '.' + st.key]]; });
          series.push({ pairs: smooth(pairs, (D.window || {})[arm]), meta: { arm: arm, stat: st.key },
            opts: { label: arm + ' ' + st.label, stroke: color(arm), dash: DASH[st.key], width: WIDTH[st.key],
                    spanGaps: true, points: { show: false },
                    value: function (u, v) { return v == null ? '-' : fmt(v, 1) + ' ms'; } } });
        });
        series.push({ pairs: mine.map(function (p) { return [p.req_s, p[L.key + '.median']]; }),
          meta: { arm: arm, stat: 'median' },
          opts: { label: arm + ' p50 points', stroke: color(arm), width: 0, paths: function () { return null; },
                  points: { show: true, size: 6, fill: color(arm) },
                  value: function (u, v) { return v == null ? '-' : fmt(v, 1) + ' ms'; } } });
      });
      var lines = D.slo[L.key] || [];
      var top = Math.max.apply(null, [0].concat(lines.map(function (l) { return l.ms; })));
      make(target, L.label + ' vs throughput' + (lines.length ? ' (red: SLO' : '') +
        (Object.keys(D.capacity || {}).length ? (lines.length ? '; ' : ' (') + 'bands: capacity)' : (lines.length ? ')' : '')),
        'achieved request throughput (req/s)', L.label + ' (ms)', series,
        aligned(function (p) { return p.req_s; }, series),
        { hooks: { drawClear: [capacityHook], draw: [sloHook(lines)] },
          yRange: function (u, min, max) { return [0, Math.max(max || 1, top * 1.15) * 1.05]; } });
    });
  }

  function paretoChart(target) {
    var series = [];
    D.arms.forEach(function (arm) {
      var pts = D.points.filter(function (p) { return p.arm === arm; });
      series.push({ pairs: pts.map(function (p) { return [p.tok_s_gpu, p.tok_s_user]; }), meta: { arm: arm, stat: null },
        opts: { label: arm + ' points', stroke: color(arm), width: 0, paths: function () { return null; },
                points: { show: true, size: 8, fill: color(arm) }, value: function (u, v) { return fmt(v, 1); } } });
      var front = D.front[arm] || [];
      series.push({ pairs: front, extraX: front.map(function (xy) { return xy[0]; }), meta: { arm: arm, stat: null },
        opts: { label: arm + ' Pareto front', stroke: color(arm), width: 2, spanGaps: true,
                points: { show: false }, value: function (u, v) { return fmt(v, 1); } } });
    });
    make(target, 'tok/s per user vs ' + D.per_gpu_label + ' (line: Pareto front)', D.per_gpu_label,
      'tok/s per user (1000 / median TPOT)', series,
      aligned(function (p) { return p.tok_s_gpu; }, series), {});
  }

  function apply() {
    charts.forEach(function (c) {
      var shown = 0;
      c.u._meta.forEach(function (m, i) {
        var show = on.arm[m.arm] && (m.stat == null || on.stat[m.stat]);
        if (c.u.series[i + 1].show !== show) c.u.setSeries(i + 1, { show: show });
        shown += show ? 1 : 0;
      });
      c.box.setAttribute('data-visible-series', shown);
    });
  }

  function toggles(target) {
    var bar = document.createElement('div'); bar.className = 'toggles';
    function box(kind, key, label, col) {
      var l = document.createElement('label'); var c = document.createElement('input');
      c.type = 'checkbox'; c.checked = true; c.id = 'toggle-' + kind + '-' + key;
      c.addEventListener('change', function () { on[kind][key] = c.checked; apply(); });
      l.appendChild(c); var s = document.createElement('span'); s.textContent = label;
      if (col) s.style.color = col; l.appendChild(s); bar.appendChild(l);
    }
    bar.appendChild(document.createTextNode('arms: '));
    D.arms.forEach(function (a) { box('arm', a, a, color(a)); });
    bar.appendChild(document.createTextNode('  percentiles: '));
    D.stats.forEach(function (s) { box('stat', s.key, s.label + ' ' + ({ median: '(solid)', p95: '(dashed)', p99: '(dotted)' })[s.key]); });
    target.appendChild(bar);
  }

  var root = document.getElementById('tradeoff');
  toggles(root);
  var grid = document.createElement('div'); grid.className = 'charts'; root.appendChild(grid);
  try {
    latencyCharts(grid); paretoChart(grid); apply();
    var m = /toggle=([^&]*)/.exec(location.hash);
    if (m) decodeURIComponent(m[1]).split(',').forEach(function (t) {
      var kv = t.split(':'); var c = document.getElementById('toggle-' + kv[0] + '-' + kv[1]); if (c) c.click();
    });
    document.body.setAttribute('data-charts-rendered', charts.length + '/' + (D.latencies.length + 1));
  } catch (e) {
    document.body.setAttribute('data-charts-rendered', 'error: ' + e);
  }
})();
