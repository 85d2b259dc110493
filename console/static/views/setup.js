// Setup: what a page and a CI job need to send here, filled in for this project.

import { projectPath, request } from "../api.js";
import { copyButton, h, replace } from "../dom.js";

/** The project's ingest keys: add one, disable or enable each (rotation, without a deploy
 * of boxtrail: add, move the pages over, disable the old). */
function ingestKeys(p) {
  const path = projectPath(p.name, "/ingest-keys");
  const el = h("div", { class: "panel", id: "ingest-keys" });
  const act = (method, url, body) => request(method, url, { body }).then(load,
    (e) => el.append(h("p", { class: "error", role: "alert" }, e.message)));
  async function load() {
    const { data } = await request("GET", path);
    replace(el, h("h2", {}, "Ingest keys"), h("ul", {}, data.map((k) => h("li", {},
      h("code", {}, k.key), ` ${k.name} `, k.enabled ? "" : "(disabled) ",
      h("button", { type: "button", class: "small", onClick: () =>
        act("PATCH", `${path}/${k.key}`, { enabled: !k.enabled }) }, k.enabled ? "Disable" : "Enable")))),
      h("button", { type: "button", class: "small", id: "add-ingest-key", onClick: () =>
        act("POST", path, { name: "" }) }, "Add a key"));
  }
  load().catch(() => el.remove());  // a key without admin: the list is not shown
  return el;
}

function block(id, title, text, note) {
  return h("div", { class: "panel" },
    h("h2", { id }, title),
    note ? h("p", { class: "muted" }, note) : null,
    h("div", { class: "copyable" },
      h("pre", { "aria-labelledby": id, tabindex: "0" }, h("code", {}, text)), copyButton(text)));
}

export function render(ctx) {
  const p = ctx.project;
  const endpoint = location.origin;
  const snippet =
    `<script src="/boxtrail.js" data-ingest-key="${p.ingestKey}"\n` +
    `        data-endpoint="${endpoint}" data-release="1.0.0"></script>`;
  const upload =
    `export BOXTRAIL_URL=${endpoint} BOXTRAIL_API_KEY=<an API key of this tenant>\n` +
    `boxtrail sourcemaps upload dist --project ${p.name} --release "$RELEASE" --url-prefix "~/"`;
  const sentryInit = `Sentry.init({ dsn: "${p.dsn}", release: "1.0.0", enableLogs: true });`;
  const origins = p.allowedOrigins.length ? p.allowedOrigins.join(", ") : "any (no list set)";
  return { el: h("section", {},
    h("h1", {}, `Set up ${p.name}`),
    h("dl", { class: "facts" },
      h("dt", {}, "Project id"), h("dd", {}, h("code", {}, p.id)),
      h("dt", {}, "Ingest key (public: it ships in pages)"),
      h("dd", {}, h("code", { id: "ingest-key" }, p.ingestKey), " ", copyButton(p.ingestKey)),
      h("dt", {}, "Allowed origins"), h("dd", {}, origins)),
    ingestKeys(p),
    block("snippet-title", "Browser SDK", snippet,
          "Serve sdk-js/dist/boxtrail.js beside your page and load it before the page's own scripts."),
    block("upload-title", "Upload source maps from CI", upload,
          "Upload the .js files and their .map files after each build; stacks are rewritten at read time."),
    block("sentry-title", "Or keep @sentry/browser", sentryInit,
          "A page instrumented with Sentry's SDK sends here by changing its DSN.")) };
}
