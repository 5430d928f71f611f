/* servelab report: the time-series panel (uPlot, inlined; nothing is fetched).
   Reads the JSON in #timeseries-data (experiment/report/timeseries.py): per load point, per
   block, per arm, each quantity as [seconds from the load's start, values]. One panel per load
   point: a selector for the block, one chart per quantity some run measured, all on the same
   time axis (cursor synced), the arms overlaid in their colours, each arm's last answer a
   dashed line. A value with no reading is a gap (null), never 0; an arm without a sample at
   an instant is skipped (undefined) so the arms' different sampling instants share one x
   array. */
(function () {
  var el = document.getElementById('timeseries-data');
  var root = document.getElementById('timeseries');
  if (!el || !root || typeof uPlot === 'undefined') {
    document.body.setAttribute('data-timeseries-rendered', 'error'); return;
  }
  var D = JSON.parse(el.textContent);
  var COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e', '#8c564b', '#e377c2', '#17becf'];
  var Q = {};
  D.quantities.forEach(function (q) { Q[q.key] = q; });
  function color(arm) { return COLORS[D.arms.indexOf(arm) % COLORS.length]; }
  function fmt(v, d) { return v == null ? '-' : (+v).toFixed(d); }
  function el_(tag, cls, text) {
    var e = document.createElement(tag); if (cls) e.className = cls;
    if (text != null) e.textContent = text; return e;
  }

  function aligned(runs, q) {
    var xs = [];
    D.arms.forEach(function (a) {
      var s = (runs[a] || {})[q];
      if (s) s[0].forEach(function (t) { if (t != null && xs.indexOf(t) < 0) xs.push(t); });
    });
    xs.sort(function (a, b) { return a - b; });
    var at = {}; xs.forEach(function (x, i) { at[x] = i; });
    var data = [xs];
    D.arms.forEach(function (a) {
      var ys = []; for (var i = 0; i < xs.length; i++) ys.push(undefined);
      var s = (runs[a] || {})[q];
      if (s) s[0].forEach(function (t, i) { if (t != null) ys[at[t]] = s[1][i]; });
      data.push(ys);
    });
    return data;
  }

  function xRange(runs, shown) {
    var lo = Infinity, hi = -Infinity;
    Object.keys(runs).forEach(function (a) {
      shown.forEach(function (q) {
        var s = runs[a][q]; if (!s) return;
        s[0].forEach(function (t) { if (t != null) { lo = Math.min(lo, t); hi = Math.max(hi, t); } });
      });
    });
    return isFinite(lo) ? [lo, hi > lo ? hi : lo + 1] : [0, 1];
  }

  // each arm's last answer as a dashed line in its colour: what lies after it is the drain
  function endHook(ends) {
    return function (u) {
      var ctx = u.ctx, e = ends();
      var yTop = u.valToPos(u.scales.y.max, 'y', true), yBot = u.valToPos(u.scales.y.min, 'y', true);
      Object.keys(e).forEach(function (a) {
        if (e[a] == null) return;
        var x = u.valToPos(e[a], 'x', true);
        ctx.save(); ctx.strokeStyle = color(a); ctx.globalAlpha = 0.6; ctx.lineWidth = devicePixelRatio;
        ctx.setLineDash([4 * devicePixelRatio, 4 * devicePixelRatio]);
        ctx.beginPath(); ctx.moveTo(x, yTop); ctx.lineTo(x, yBot); ctx.stroke(); ctx.restore();
      });
    };
  }

  var charts = 0;
  function panel(P, pi) {
    var box = el_('div', 'ts-panel'); box.setAttribute('data-load', P.load_key);
    box.appendChild(el_('h3', null, 'load ' + P.load_key));
    var bar = el_('div', 'toggles'); var lab = el_('label', null, 'block: ');
    var sel = el_('select'); sel.id = 'ts-block-' + pi;
    P.blocks.forEach(function (b, i) {
      var o = el_('option', null, b.label + ' (' + Object.keys(b.runs).join(', ') + ')');
      o.value = i; sel.appendChild(o);
    });
    lab.appendChild(sel); bar.appendChild(lab);
    D.arms.forEach(function (a) { var s = el_('span', null, '\u25a0 ' + a + '  '); s.style.color = color(a); bar.appendChild(s); });
    box.appendChild(bar);
    if (P.notes.length) {
      var ul = el_('ul', 'ts-notes');
      P.notes.forEach(function (n) { ul.appendChild(el_('li', null, n)); });
      box.appendChild(ul);
    }
    var missing = el_('p', 'ts-missing'); box.appendChild(missing);
    var grid = el_('div', 'charts'); box.appendChild(grid);
    root.appendChild(box);
    var xr = [0, 1], ends = {};
    var cs = P.shown.map(function (q) {
      var c = el_('div', 'chart'); c.setAttribute('data-quantity', q); grid.appendChild(c);
      var u = new uPlot({
        title: Q[q].label + ' (' + Q[q].unit + ')', width: 520, height: 200,
        cursor: { sync: { key: 'ts-' + pi } },
        scales: { x: { time: false, range: function () { return xr; } } },
        axes: [{ label: "seconds from the load's start" }, { label: Q[q].unit, size: 60 }],
        series: [{ label: 's', value: function (u, v) { return fmt(v, 2); } }].concat(D.arms.map(function (a) {
          return { label: a, stroke: color(a), width: 2, points: { show: true, size: 4, fill: color(a) },
                   value: function (u, v) { return v == null ? '-' : fmt(v, 1) + ' ' + Q[q].unit; } };
        })),
        legend: { live: true },
        hooks: { draw: [endHook(function () { return ends; })] }
      }, [[]].concat(D.arms.map(function () { return []; })), c);
      charts++;
      return { u: u, q: q, box: c };
    });
    function show(i) {
      var b = P.blocks[i], gone = [];
      xr = xRange(b.runs, P.shown); ends = b.load_end_s || {};
      Object.keys(ends).forEach(function (a) { if (ends[a] != null) xr[1] = Math.max(xr[1], ends[a]); });
      cs.forEach(function (c) {
        var d = aligned(b.runs, c.q);
        c.u.setData(d);
        c.box.setAttribute('data-points', D.arms.map(function (a, k) {
          return a + ':' + d[k + 1].filter(function (v) { return typeof v === 'number'; }).length;
        }).join(','));
        D.arms.forEach(function (a) {
          if (b.runs[a] && !b.runs[a][c.q]) gone.push(a + ' has no ' + Q[c.q].label);
        });
      });
      D.arms.forEach(function (a) { if (!b.runs[a]) gone.push(a + ' has no stored series in ' + b.label); });
      missing.textContent = gone.length ? 'not measured in this block (left out): ' + gone.join('; ') : '';
      box.setAttribute('data-block', b.label);
    }
    sel.addEventListener('change', function () { show(+sel.value); });
    show(0);
  }

  try {
    if (D.notes.length) {
      var ul = el_('ul', 'ts-notes');
      D.notes.forEach(function (n) { ul.appendChild(el_('li', null, n)); });
      root.appendChild(ul);
    }
    D.panels.forEach(panel);
    var m = /block=(\d+):(\d+)/.exec(location.hash);  // #block=PANEL:BLOCK selects at load
    if (m) {
      var s = document.getElementById('ts-block-' + m[1]);
      if (s) { s.value = m[2]; s.dispatchEvent(new Event('change')); }
    }
    document.body.setAttribute('data-timeseries-rendered', D.panels.length + ' panels, ' + charts + ' charts');
  } catch (e) {
    document.body.setAttribute('data-timeseries-rendered', 'error: ' + e);
  }
})();
