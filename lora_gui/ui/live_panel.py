"""The Train tab's live charts on the page: Plotly charts that stay on the page and take each
tick's new points in place (the answers come from lora_gui.ui.live_charts).

The charts are plain divs inside a gr.HTML whose value carries each tick's answer (JSON). Its
script keeps every chart's data, appends the new points, redraws the chart where it is
(``Plotly.react`` on the same div) and writes back ``"seen N"``, the number of the answer it
applied, which the next tick sends so the server knows what the page holds. Plotly is the copy
gradio's own plot component ships (loaded from the server's assets, no network).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import gradio as gr

logger = logging.getLogger(__name__)

MAIN_CHARTS = ("memory-plot", "loss-plot", "throughput-plot")  # the run panel's element ids
STEP_PEAK = "step-peak-plot"  # in the "More charts" accordion
CHART_IDS = (MAIN_CHARTS[0], STEP_PEAK, *MAIN_CHARTS[1:])
CHART_HEIGHT = 280  # px: the run panel's charts, legend below included (the peak per step: 320)


def plotly_asset() -> str | None:
    """The path (under the server's root) of the Plotly bundle gradio's plot component loads;
    None when this gradio has none (the charts then wait for gradio's own plot to load it)."""
    assets = Path(gr.__file__).parent / "templates" / "frontend" / "assets"
    found = sorted(assets.glob("PlotlyPlot-*.js"))
    if not found:
        logger.warning("no Plotly bundle under %s: the live charts wait for a gradio plot to load it",
                       assets)
        return None
    return f"assets/{found[0].name}"


# Runs once when the panel is on the page (``element``, ``props`` and ``watch`` are gradio's).
PAGE_SCRIPT = """
const PLOTLY = %(plotly)s, CONFIG = {responsive: true, displaylogo: false};
const live = window.loraLive = window.loraLive || {charts: {}, seq: 0, whole: 0, parts: 0, skipped: 0};
if (!live.loading) {
  live.loading = window.Plotly || !PLOTLY ? Promise.resolve()
    : import(new URL(PLOTLY, document.baseURI).href).catch((e) => console.error('Plotly:', e));
}
live.draw = function () {  // every chart with new points that is on screen, in place
  if (!window.Plotly) { live.loading.then(() => window.Plotly && live.draw()); return; }
  for (const id in live.charts) {
    const chart = live.charts[id], outer = document.getElementById(id);
    const div = outer && outer.querySelector('.live-plot');
    if (!div || !div.offsetParent || (!chart.dirty && div._fullLayout)) continue;  // hidden: later
    chart.layout.datarevision = ++chart.rev;
    window.Plotly.react(div, chart.data, chart.layout, CONFIG);
    chart.dirty = false;
  }
};
function apply(answer) {
  if (answer.after !== null && answer.after !== live.seq) { live.skipped++; return; }  // next: all
  for (const id in answer.charts) {
    const part = answer.charts[id], chart = live.charts[id];
    live[part.full ? 'whole' : 'parts']++;  // charts sent whole / as new points (tests read them)
    if (part.full) {
      live.charts[id] = {data: part.traces, layout: part.layout, rev: chart ? chart.rev : 0, dirty: true};
      continue;
    }
    if (part.layout) chart.layout = part.layout;
    part.traces.forEach((t, i) => {
      const trace = chart.data[i];
      trace.x = Array.from(trace.x).slice(0, t.keep).concat(t.x);
      trace.y = Array.from(trace.y).slice(0, t.keep).concat(t.y);
    });
    chart.dirty = true;
  }
  live.seq = answer.seq;
  live.draw();
}
watch('value', () => {
  const text = props.value;
  if (typeof text !== 'string' || text[0] !== '{') return;
  try { apply(JSON.parse(text)); } finally { props.value = 'seen ' + live.seq; }
});
if (!live.timer) live.timer = setInterval(() => live.draw(), 1000);  // a tab or accordion opened
"""

CSS = """
.live-chart { min-height: %(height)dpx; width: 100%%; }
.live-row { display: flex; flex-wrap: wrap; gap: 8px; }
.live-row > .live-chart { flex: 1 1 220px; min-width: 220px; }  /* narrower: one a row */
"""


def _chart(chart_id: str) -> str:
    return f'<div id="{chart_id}" class="live-chart"><div class="live-plot"></div></div>'


def charts_panel() -> gr.HTML:
    """Memory over time above loss and throughput; its value is each tick's answer."""
    memory, loss, throughput = (_chart(c) for c in MAIN_CHARTS)
    script = PAGE_SCRIPT % {"plotly": json.dumps(plotly_asset())}
    return gr.HTML("", html_template=f'<div class="live-charts">{memory}<div class="live-row">{loss}'
                   f'{throughput}</div></div>', css_template=CSS % {"height": CHART_HEIGHT},
                   js_on_load=script, elem_id="live-charts", padding=False)


def step_peak_panel() -> gr.HTML:
    """The peak per step's place in "More charts" (the panel's script draws into it when open)."""
    return gr.HTML("", html_template=_chart(STEP_PEAK), css_template=CSS % {"height": 320},
                   js_on_load=None, elem_id="step-peak-panel", padding=False)
