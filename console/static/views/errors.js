// Errors: groups by fingerprint (count, first and last seen, boxes, a sparkline); a group
// opens its latest sample with the rewritten stack, each frame at its original line, the
// minified frame on demand, and why a frame stayed minified with what to do about it.

import { get, projectPath } from "../api.js";
import { h, replace, svg, table } from "../dom.js";
import { ago } from "../format.js";
import { queryProblem } from "./common.js";

// What each `problem` means and what to do (README, "Source maps").
export const PROBLEMS = {
  missing_sourcemap: ["No source map was uploaded for this file's URL or debug id.",
                      "Upload this build's .js and .map files (Setup shows the command)."],
  url_mismatch: ["A file of this name was uploaded, but at another URL.",
                 "Check --url-prefix against the frame's URL."],
  no_mapping: ["The map has no mapping at this line and column.",
               "The JS served differs from the JS uploaded: upload the build that is deployed."],
  release_mismatch: ["No mapping here, and the only maps are of other releases.",
                     "Upload this release's maps."],
  malformed_sourcemap: ["The stored map cannot be read.", "Upload it again."],
  no_location: ["The engine printed no position for this frame.", "Nothing to do: no map can place it."],
  missing_column: ["The engine printed no column (eval code).", "Nothing to do: no map can place it."],
  invalid_location: ["The printed line or column cannot be in any file.", "Nothing to do."],
  no_original_source: ["The bundler generated this code; it has no original source.", "Nothing to do."],
  sourcemap_unavailable: ["Storage could not be read just now.", "Reload in a moment."],
  internal_error: ["boxtrail failed on this frame (logged on the server).", "Report it."],
  missing_source_name: ["The map points at code without a source file.", "Nothing to do."],
  missing_sources_content: ["The map has no sourcesContent: no source lines to show.",
                            "Build with sourcesContent included (the default of most bundlers)."],
  missing_minified_source: ["The map came without its JS: no function name.",
                            "Upload the .js files with their maps."],
};

function sparkline(series) {
  const values = series || [];
  const max = Math.max(1, ...values);
  const w = 120;
  const hgt = 24;
  const step = w / Math.max(1, values.length - 1);
  const points = values.map((v, i) => `${(i * step).toFixed(1)},${(hgt - (v / max) * (hgt - 2) - 1).toFixed(1)}`);
  return svg("svg", { class: "sparkline", viewBox: `0 0 ${w} ${hgt}`, width: w, height: hgt,
                      role: "img", "aria-label": `counts over the window: ${values.join(", ")}` },
    svg("polyline", { points: points.join(" "), fill: "none" }));
}

function title(row) {
  const e = row.error || {};
  return [e.type, e.message || row.message].filter(Boolean).join(": ") || "(no message)";
}

export function render(ctx) {
  const { params, project, path } = ctx;
  const since = params.get("since") || "24h";
  const box = params.get("box") || "";
  const fingerprint = path[3] || null;
  const controller = new AbortController();
  const body = h("div", {}, h("p", { class: "muted", role: "status" }, "Loading errors…"));
  const range = h("select", { id: "errors-since", name: "since" },
    [["1h", "Last hour"], ["24h", "Last 24 hours"], ["7d", "Last 7 days"]].map(([value, label]) =>
      h("option", { value, selected: value === since }, label)));
  const boxInput = h("input", { id: "errors-box", value: box, placeholder: "any box", autocomplete: "off" });
  const form = h("form", { class: "toolbar", onSubmit: (event) => {
    event.preventDefault();
    ctx.navigate(["p", project.name, "errors"], { since: range.value, box: boxInput.value.trim() });
  } }, h("label", { for: "errors-since" }, "Window"), range,
    h("label", { for: "errors-box" }, "Box"), boxInput, h("button", { type: "submit" }, "Show"));

  (async () => {
    try {
      const data = await get(projectPath(project.name, "/errors"),
                             { since, boxId: box, groupBy: "fingerprint", limit: 200 }, controller.signal);
      if (fingerprint) {
        const group = data.groups.find((g) => g.fingerprint === fingerprint);
        replace(body, group ? groupView(project, group, { since, box })
                            : h("p", {}, "This error group is not among the 200 largest of the window. ",
                                since === "7d" ? null : h("a", { href: `#/p/${encodeURIComponent(project.name)}/errors/${fingerprint}?${new URLSearchParams({ since: "7d", ...(box ? { box } : {}) })}` }, "Look further back")));
      } else {
        replace(body, groupList(project, data, { since, box }));
      }
    } catch (err) {
      if (err.name !== "AbortError") replace(body, queryProblem(err));
    }
  })();

  return {
    el: h("section", {}, h("h1", { class: "sr-only" }, `Errors of ${project.name}`), form, body),
    dispose() { controller.abort(); },
  };
}

function groupList(project, data, state) {
  if (!data.groups.length) return h("p", { class: "muted" }, "No errors in this window.");
  const q = new URLSearchParams({ since: state.since, ...(state.box ? { box: state.box } : {}) });
  return [
    table({ class: "groups", id: "error-groups" },
      ["Error", "Events", "Trend", "First seen", "Last seen", "Boxes"],
      data.groups.map((g) => h("tr", {},
        h("td", {}, h("a", { href: `#/p/${encodeURIComponent(project.name)}/errors/${g.fingerprint}?${q}`,
                             class: "group-link" }, title(g.sample))),
        h("td", { class: "num" }, g.count.toLocaleString()),
        h("td", {}, sparkline(g.series)),
        h("td", { title: g.firstSeen }, ago(g.firstSeen)),
        h("td", { title: g.lastSeen }, ago(g.lastSeen)),
        h("td", {}, g.boxes.slice(0, 3).join(", ") + (g.boxes.length > 3 ? ` +${g.boxes.length - 3}` : ""))))),
    data.truncated ? h("p", { class: "muted" }, `Built from the newest ${data.scannedRows.toLocaleString()} error rows; older ones are not counted.`) : null,
  ];
}

function groupView(project, group, state) {
  const row = group.sample;
  const frames = (row.error && row.error.frames) || [];
  const raw = h("pre", { class: "stack", hidden: true, id: "raw-stack" }, (row.error && row.error.rawStack) || "");
  return h("article", { class: "error-group" },
    h("p", {}, h("a", { href: `#/p/${encodeURIComponent(project.name)}/errors?${new URLSearchParams({ since: state.since, ...(state.box ? { box: state.box } : {}) })}` }, "← All errors")),
    h("h2", { id: "error-title" }, title(row)),
    h("dl", { class: "facts" },
      h("dt", {}, "Events"), h("dd", {}, `${group.count.toLocaleString()} (first ${ago(group.firstSeen)}, last ${ago(group.lastSeen)})`),
      h("dt", {}, "Boxes"), h("dd", {}, group.boxes.join(", ") || "–"),
      h("dt", {}, "Latest"), h("dd", {}, `${row.ts}${row.release ? ` · release ${row.release}` : ""}${row.url ? ` · ${row.url}` : ""}`)),
    h("h3", {}, "Stack"),
    h("ol", { class: "frames", id: "frames" }, frames.map(frameView)),
    toggle("Stack as sent", raw), raw);
}

let toggles = 0;

/** A button that shows and hides `target`, saying which it is to assistive technology. */
function toggle(label, target) {
  target.id = target.id || `toggled-${++toggles}`;
  const button = h("button", { type: "button", class: "small", "aria-expanded": "false",
                               "aria-controls": target.id, onClick: () => {
    target.hidden = !target.hidden;
    button.setAttribute("aria-expanded", String(!target.hidden));
  } }, label);
  return button;
}

function frameView(frame) {
  const where = frame.file ? `${frame.file}:${frame.line ?? "?"}:${frame.column ?? "?"}` : frame.raw;
  const minified = h("pre", { class: "minified", hidden: true }, frame.raw);
  const parts = [
    h("div", { class: "frame-head" },
      h("code", { class: "fn" }, frame.function || "(anonymous)"), " ",
      h("span", { class: "file" }, where),
      frame.symbolicated ? h("span", { class: "tag ok-tag" }, "original")
                         : frame.problem ? h("span", { class: "tag warn-tag" }, "minified") : null,
      toggle("Minified frame", minified)),
  ];
  if (frame.contextLine !== null && frame.contextLine !== undefined) {
    const first = (frame.line || 1) - frame.preContext.length;
    const lines = [...frame.preContext, frame.contextLine, ...frame.postContext];
    parts.push(h("pre", { class: "source" }, lines.map((text, i) =>
      h("span", { class: ["src-line", i === frame.preContext.length && "hit"] },
        h("span", { class: "lineno" }, String(first + i).padStart(5, " ")), "  ", text, "\n"))));
  }
  if (frame.problem) {
    const [meaning, fix] = PROBLEMS[frame.problem] || ["", ""];
    parts.push(h("p", { class: "problem" }, h("code", {}, frame.problem), meaning ? `: ${meaning} ` : " ",
      fix ? h("strong", {}, fix) : null));
  }
  parts.push(minified);
  return h("li", { class: ["frame", frame.symbolicated ? "symbolicated" : "raw"] }, parts);
}
