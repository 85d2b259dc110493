// Search: a time window, a query in the search language and a box; a histogram of the
// matching rows by level; the rows newest first, paged with nextCursor. All of it is in
// the URL hash, so a view can be shared.

import { get, projectPath } from "../api.js";
import { h, replace, svg } from "../dom.js";
import { LEVELS, levelClass } from "../format.js";
import { filterInputs, queryProblem, rowCells, rowDetails } from "./common.js";

const PRESETS = [["15m", "Last 15 minutes"], ["1h", "Last hour"], ["6h", "Last 6 hours"],
                 ["24h", "Last 24 hours"], ["7d", "Last 7 days"], ["custom", "Custom range"]];

/** A datetime-local value (local time) as ISO-8601 UTC, or "". */
function toIso(local) {
  const ms = Date.parse(local);
  return Number.isNaN(ms) ? "" : new Date(ms).toISOString();
}

function toLocal(iso) {
  const ms = Date.parse(iso);
  if (Number.isNaN(ms)) return "";
  const d = new Date(ms - new Date(ms).getTimezoneOffset() * 60000);
  return d.toISOString().slice(0, 16);
}

export function render(ctx) {
  const { params, project } = ctx;
  const since = params.get("since") || "1h";
  const until = params.get("until") || "";
  // A duration that is not a preset (a shared "since=2d") is offered as it is.
  const presets = PRESETS.some(([value]) => value === since) || !/^\d+[smhdw]$/.test(since)
    ? PRESETS : [[since, `Last ${since}`], ...PRESETS];
  const isCustom = !presets.some(([value]) => value === since) || Boolean(until);
  const filters = filterInputs(params, "search");
  const range = h("select", { id: "search-since", name: "since" },
    presets.map(([value, label]) => h("option", { value, selected: isCustom ? value === "custom" : value === since }, label)));
  const from = h("input", { id: "search-from", type: "datetime-local", value: isCustom ? toLocal(since) : "" });
  const to = h("input", { id: "search-until", type: "datetime-local", value: until ? toLocal(until) : "" });
  const custom = h("span", { class: "custom", hidden: !isCustom },
    h("label", { for: "search-from" }, "From"), from, h("label", { for: "search-until" }, "Until"), to);
  range.addEventListener("change", () => { custom.hidden = range.value !== "custom"; });

  const form = h("form", { class: "toolbar", role: "search", onSubmit: (event) => {
    event.preventDefault();
    const state = { q: filters.query.value.trim(), box: filters.box.value.trim() };
    if (range.value === "custom") {
      state.since = toIso(from.value) || "1h";
      state.until = toIso(to.value);
    } else {
      state.since = range.value;
    }
    ctx.navigate(["p", project.name, "search"], state);
  } }, h("label", { for: "search-since" }, "Window"), range, custom, filters.nodes,
    h("button", { type: "submit" }, "Search"));

  const problem = h("div");
  const chart = h("figure", { class: "histogram", id: "histogram" });
  const results = h("ol", { class: "results", id: "search-results" });
  const more = h("div", { class: "more" });
  const summary = h("p", { class: "muted", role: "status", id: "search-summary" }, "Searching…");
  const controller = new AbortController();
  const query = { since, until, query: params.get("q") || "", boxId: params.get("box") || "" };

  async function loadPage(cursor) {
    const page = await get(projectPath(project.name, "/logs"), { ...query, limit: 100, cursor },
                           controller.signal);
    results.append(...page.rows.map(resultItem));
    const button = h("button", { type: "button", id: "load-more", onClick: () => {
      button.disabled = true;  // one page at a time: a second click would load it twice
      loadPage(page.nextCursor).catch((err) => { button.disabled = false; show(err); });
    } }, "Load more");
    replace(more, page.nextCursor ? button : null);
    const shown = results.children.length;
    summary.textContent = shown ? `${shown.toLocaleString()} rows shown, newest first` : "No rows match.";
  }

  function show(err) {
    if (err.name === "AbortError") return;
    summary.textContent = "";
    replace(problem, queryProblem(err));
  }

  (async () => {
    try {
      const [histogram] = await Promise.all([
        get(projectPath(project.name, "/histogram"), { ...query, buckets: 100 }, controller.signal),
        loadPage(null),
      ]);
      replace(chart, drawHistogram(histogram));
    } catch (err) {
      show(err);
    }
  })();

  return {
    el: h("section", {}, h("h1", { class: "sr-only" }, `Search ${project.name}`), form, problem,
      chart, summary, results, more),
    dispose() { controller.abort(); },
  };
}

function resultItem(row) {
  const body = h("div", { class: "expanded" });
  const line = h("button", { type: "button", class: "result-line", "aria-expanded": "false",
                             onClick: () => {
    const open = item.classList.toggle("open");
    line.setAttribute("aria-expanded", String(open));
    replace(body, open ? rowDetails(row) : null);
  } }, rowCells(row));
  const item = h("li", { class: "result" }, line, body);
  return item;
}

/** Stacked bars of counts per bucket and level, as SVG built node by node. */
export function drawHistogram(data) {
  const buckets = data.buckets || [];
  const width = 1000;
  const height = 90;
  const max = Math.max(1, ...buckets.map((b) => Object.values(b.counts).reduce((a, n) => a + n, 0)));
  const barW = width / Math.max(1, buckets.length);
  const bars = [];
  buckets.forEach((bucket, i) => {
    let y = height;
    const order = [...LEVELS, ...Object.keys(bucket.counts).filter((l) => !LEVELS.includes(l))];
    const label = order.filter((l) => bucket.counts[l]).map((l) => `${l} ${bucket.counts[l]}`).join(", ");
    const group = svg("g", {}, svg("title", {}, `${bucket.ts}: ${label || "none"}`));
    for (const level of order) {
      const n = bucket.counts[level];
      if (!n) continue;
      const barH = (n / max) * height;
      y -= barH;
      group.append(svg("rect", { x: (i * barW + 0.5).toFixed(1), y: y.toFixed(1),
                                 width: Math.max(1, barW - 1).toFixed(1), height: barH.toFixed(1),
                                 class: `bar ${levelClass(level)}` }));
    }
    bars.push(group);
  });
  const legend = h("ul", { class: "legend" }, LEVELS.map((level) => h("li", {},
    h("span", { class: ["swatch", levelClass(level)] }), level)));
  return [
    svg("svg", { viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", role: "img",
                 "aria-label": `${data.total} matching rows over time, by level` }, bars),
    h("figcaption", {}, `${(data.total || 0).toLocaleString()} rows from ${data.from} to ${data.to}, ${data.bucketSeconds}s per bar`, legend),
  ];
}
