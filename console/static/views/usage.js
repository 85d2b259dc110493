// Usage: what the tenant, or one project, used over a window: a bar chart per kind that has
// data (GET /v1/usage, which needs usage:read or admin), and for a project what became of
// its events (GET .../outcomes): accepted, refused by reason, discarded by its SDKs.

import { get, projectPath } from "../api.js";
import { h, replace, svg, table } from "../dom.js";
import { bytes } from "../format.js";

// A window: its interval, in seconds, and how many intervals back it starts.
const WINDOWS = { "1h": ["minute", 60, 60], "24h": ["hour", 3600, 24], "7d": ["day", 86400, 7] };

const amount = (n, unit) => unit === "bytes" ? bytes(n)
  : unit === "byte_hours" ? `${bytes(n)}·h` : `${n.toLocaleString()} ${unit}`;

export function render(ctx) {
  const { project, params } = ctx;
  const since = Object.hasOwn(WINDOWS, params.get("since")) ? params.get("since") : "24h";
  const [interval, step, count] = WINDOWS[since];
  const query = { since, interval };
  const pick = h("select", { id: "usage-since",
                             onChange: () => ctx.navigate(ctx.path, { since: pick.value }) },
    Object.keys(WINDOWS).map((w) => h("option", { selected: w === since }, w)));
  const status = h("div", { role: "status", id: "usage-status" }, "Loading…");
  const charts = h("div", { class: "charts", id: "usage-charts" });
  const outcomes = h("div", { id: "usage-outcomes" });
  const controller = new AbortController();
  const failed = (el) => (err) => err.name === "AbortError" || replace(el, h("p",
    { class: "error", role: "alert" }, err.status === 403
      ? "This API key may not read usage: that needs the usage:read or admin scope." : err.message));

  (async () => {
    const kinds = {};
    let cursor;
    do {
      const page = await get("/v1/usage", { ...query, project: project?.id, groupBy: "project",
                                            limit: 1e4, cursor }, controller.signal);
      for (const r of page.rows) {
        const k = kinds[r.kind] ||= { unit: r.unit, total: 0, at: {} };
        k.total += r.quantity;
        k.at[r.at] = (k.at[r.at] || 0) + r.quantity;
      }
      cursor = page.nextCursor;
    } while (cursor);
    const names = Object.keys(kinds).sort();
    status.textContent = names.length ? "" : "No usage in this window.";
    const ms = step * 1000;
    const first = Math.floor(Date.now() / ms) - count;
    replace(charts, names.map((kind) => {
      const { unit, total, at } = kinds[kind];
      const max = Math.max(1, ...Object.values(at));
      return h("figure", { class: "histogram", "data-kind": kind },
        svg("svg", { viewBox: `0 0 ${count + 1} 1`, preserveAspectRatio: "none", role: "img",
                     "aria-label": `${kind} per ${interval}` },
          Object.entries(at).map(([t, q]) => svg("rect", {
            class: "bar", x: Date.parse(t) / ms - first + 0.1, y: 1 - q / max, width: 0.8,
            height: q / max }, svg("title", {}, `${t}: ${amount(q, unit)}`)))),
        h("figcaption", {}, h("strong", {}, kind), amount(total, unit)));
    }));
  })().catch(failed(status));

  // Each outcome's total, then its events (and the requests refused whole) by reason.
  if (project) get(projectPath(project.name, "/outcomes"), query, controller.signal).then((o) => {
    const by = {};
    for (const r of o.rows) {
      if (!r.reason) continue;
      const s = (by[r.outcome] ||= {})[r.reason] ||= [0, 0];
      s[0] += r.events;
      s[1] += r.requests;
    }
    replace(outcomes, table({}, ["Outcome", "Reason", "Events", "Requests refused"],
      Object.entries(o.totals).flatMap(([k, n]) => [[k, "total", n, ""],
        ...Object.entries(by[k] || {}).map(([reason, s]) => [k, reason, ...s])])
        .map((line) => h("tr", {}, line.map((v) => typeof v === "number"
          ? h("td", { class: "num" }, v.toLocaleString()) : h("td", {}, v))))));
  }).catch(failed(outcomes));

  return {
    el: h("section", {}, h("h1", {}, `Usage of ${project ? project.name : ctx.session.tenantName}`),
      h("div", { class: "toolbar" }, h("label", { for: "usage-since" }, "Last"), pick),
      outcomes, status, charts),
    dispose() { controller.abort(); },
  };
}
