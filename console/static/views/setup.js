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

/** The project's deletion jobs, and its deletion: the name typed again arms the button. */
function deletion(ctx, p) {
  const jobs = h("ul", { id: "deletion-jobs" });
  const typed = h("input", { id: "confirm-delete", autocomplete: "off", placeholder: p.name });
  const status = h("p", { role: "alert", id: "delete-status" });
  const button = h("button", { type: "button", class: "danger", id: "delete-project",
    disabled: true, onClick: async () => {
      try {
        const { data } = await request("DELETE", projectPath(p.name, ""));
        await ctx.refreshProjects();
        replace(el.closest("section"), h("h1", {}, `${p.name} is deleted`),
          h("p", { id: "deletion-job" }, "Its data is being erased by job ", h("code", {}, data.id),
            `: GET /v1/deletions/${data.id} says when it is purged.`),
          h("a", { href: "#/projects" }, "Projects"));
      } catch (err) {
        status.textContent = err.message;
      }
    } }, "Delete this project");
  typed.addEventListener("input", () => { button.disabled = typed.value !== p.name; });
  const el = h("div", { class: "panel" }, h("h2", {}, "Delete the project"),
    h("p", { class: "muted" }, "Its logs, source maps and keys are erased; this cannot be undone."),
    h("label", { for: "confirm-delete" }, `Type ${p.name} to confirm`), typed, button, status,
    h("h2", {}, "Deletion jobs"), jobs);
  request("GET", projectPath(p.name, "/deletions")).then(({ data }) => replace(jobs,
    data.length ? data.map((j) => h("li", {}, h("code", {}, j.id), ` ${JSON.stringify(j.selects)} `,
      j.state, j.purgedAt ? ` purged ${j.purgedAt}` : "", ` (${j.removed.rows + j.removed.bufferedRows} rows)`))
      : h("li", { class: "muted" }, "None."))).catch(() => el.remove());  // needs admin
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
          "A page instrumented with Sentry's SDK sends here by changing its DSN."),
    deletion(ctx, p)) };
}
