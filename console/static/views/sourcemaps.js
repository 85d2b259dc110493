// Source maps: the releases uploaded, their files and debug ids, what each upload lacks,
// and deleting a release.

import { get, projectPath, request } from "../api.js";
import { h, replace, table } from "../dom.js";
import { ago, bytes } from "../format.js";

/** What the upload warned about, as far as the stored files still tell. */
function warnings(file) {
  const out = [];
  if (!file.hasJs) out.push(["map_without_js", "the map came without its JS: frames get no function names from it"]);
  if (!file.sourcesContent) out.push(["missing_sources_content", "no sourcesContent: frames are rewritten without source lines"]);
  return out;
}

export function render(ctx) {
  const { project } = ctx;
  const body = h("div", {}, h("p", { class: "muted", role: "status" }, "Loading…"));
  const status = h("p", { role: "status", id: "sourcemaps-status" });
  let sections = 0;

  async function load() {
    const { files } = await get(projectPath(project.name, "/sourcemaps"));
    if (!files.length) {
      replace(body, h("p", { class: "muted" }, "Nothing uploaded yet. ",
        h("a", { href: `#/p/${encodeURIComponent(project.name)}/setup` }, "Setup"), " shows the CI command."));
      return;
    }
    const releases = new Map();
    for (const file of files) {
      const key = file.release ?? "";
      if (!releases.has(key)) releases.set(key, []);
      releases.get(key).push(file);
    }
    replace(body, [...releases.entries()].map(([release, list]) => releaseView(release, list)));
  }

  function releaseView(release, files) {
    const label = release === "" ? "Without a release" : `Release ${release}`;
    const id = `release-${++sections}`;
    const remove = h("button", { type: "button", class: "small danger", onClick: async () => {
      if (remove.dataset.armed !== "1") {
        remove.dataset.armed = "1";
        remove.textContent = `Really delete ${files.length} files?`;
        return;
      }
      try {
        // In the path, not in `query`: release="" (files without a release) must be sent.
        const { data } = await request("DELETE",
          `${projectPath(project.name, "/sourcemaps")}?release=${encodeURIComponent(release)}`);
        status.textContent = `Deleted ${data.deleted} files of ${label.toLowerCase()}.`;
        await load();
      } catch (err) {
        status.textContent = err.message;
      }
    } }, "Delete release");
    return h("section", { class: "panel release", "aria-labelledby": id },
      h("div", { class: "release-head" }, h("h2", { id }, label), remove),
      table({}, ["Served at", "Files", "Debug id", "Size", "Uploaded", "Warnings"],
        files.map((f) => h("tr", {},
          h("td", {}, h("code", {}, f.url)),
          h("td", {}, f.hasJs ? f.name : "–", h("br"), h("span", { class: "muted" }, f.mapName)),
          h("td", {}, f.debugId ? h("code", {}, f.debugId) : "–"),
          h("td", { class: "num" }, bytes(f.jsBytes + f.mapBytes)),
          h("td", { title: f.uploadedAt }, ago(f.uploadedAt)),
          h("td", {}, warnings(f).map(([code, text]) => h("div", { class: "warn-text" }, h("code", {}, code), `: ${text}`)))))));
  }

  load().catch((err) => replace(body, h("p", { class: "error", role: "alert" }, err.message)));
  return { el: h("section", {}, h("h1", {}, `Source maps of ${project.name}`), status, body) };
}
