// Setup: what a page and a CI job need to send here, filled in for this project.

import { copyButton, h } from "../dom.js";

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
    block("snippet-title", "Browser SDK", snippet,
          "Serve sdk-js/dist/boxtrail.js beside your page and load it before the page's own scripts."),
    block("upload-title", "Upload source maps from CI", upload,
          "Upload the .js files and their .map files after each build; stacks are rewritten at read time."),
    block("sentry-title", "Or keep @sentry/browser", sentryInit,
          "A page instrumented with Sentry's SDK sends here by changing its DSN.")) };
}
