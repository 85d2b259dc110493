// Pieces several views share: a row's one-line form, the filter form, query errors.

import { h } from "../dom.js";
import { details, levelClass, oneLine, shortTime } from "../format.js";

export function levelBadge(level) {
  return h("span", { class: ["level", levelClass(level)] }, level);
}

/** The cells of a row's one-line form: time, level, box, message. */
export function rowCells(row) {
  return [
    h("span", { class: "ts", title: row.ts }, shortTime(row.ts)),
    levelBadge(row.level),
    h("span", { class: "box", title: row.boxId || "" }, row.boxId || "–"),
    h("span", { class: "msg" }, h("span", { class: "text" }, oneLine(row.message)),
      row.problem ? h("span", { class: "tag warn-tag" }, row.problem.split(":")[0]) : null),
  ];
}

export function rowDetails(row) {
  return h("pre", { class: "details", tabindex: "0" }, details(row));
}

/** The server's 400 invalid_query shown under the query box, with a caret at its position. */
export function queryProblem(err) {
  if (!err) return null;
  const { position, query } = err.detail || {};
  const pointer = typeof position === "number" && typeof query === "string"
    ? h("pre", { class: "caret" }, `${query}\n${" ".repeat(Math.min(position, query.length))}^`)
    : null;
  return h("div", { class: "error", role: "alert", id: "query-error" },
    h("strong", {}, err.code === "invalid_query" ? "Query error: " : "Error: "),
    err.message.split("\n")[0], pointer);
}

/** Box and query inputs of a filter form, with their labels. */
export function filterInputs(params, prefix) {
  const query = h("input", { id: `${prefix}-query`, name: "q", value: params.get("q") || "",
                             placeholder: "level:error checkout", autocomplete: "off",
                             spellcheck: "false", class: "wide" });
  const box = h("input", { id: `${prefix}-box`, name: "box", value: params.get("box") || "",
                           placeholder: "any box", autocomplete: "off", spellcheck: "false" });
  return {
    query, box,
    nodes: [h("label", { for: `${prefix}-query` }, "Query"), query,
            h("label", { for: `${prefix}-box` }, "Box"), box],
  };
}
