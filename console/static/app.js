// The console's shell: sign-in, the header, and the hash router that renders one view.
// Each view is a module with render(ctx) -> {el, dispose?}; its state lives in the URL hash.

import { currentSession, get, signIn, signOut, whenSignedOut, ApiError, projectPath } from "./api.js";
import { h, replace } from "./dom.js";
import { hashFor, parseHash } from "./format.js";
import * as projects from "./views/projects.js";
import * as setup from "./views/setup.js";
import * as tail from "./views/tail.js";
import * as search from "./views/search.js";
import * as errors from "./views/errors.js";
import * as sourcemaps from "./views/sourcemaps.js";
import * as keys from "./views/keys.js";
import * as usage from "./views/usage.js";

const root = document.getElementById("app");
const TABS = [["setup", "Setup", setup], ["tail", "Live tail", tail], ["search", "Search", search],
              ["errors", "Errors", errors], ["sourcemaps", "Source maps", sourcemaps],
              ["usage", "Usage", usage]];
// Pages of the tenant, not of a project.
const PAGES = { keys, usage };
let session = null;
let current = null;  // the rendered view: {el, dispose}
let projectList = [];
let routeSeq = 0;  // a newer route() supersedes one still waiting on the network

export function navigate(path, params, { replace: swap = false } = {}) {
  const hash = hashFor(path, params);
  if (hash === location.hash) return route();
  if (swap) {
    history.replaceState(null, "", hash);
    route();
  } else {
    location.hash = hash;  // hashchange routes
  }
}

function showSignIn(message) {
  routeSeq += 1;  // a route() still waiting on the network renders nothing now
  dispose();
  session = null;
  document.title = "Sign in · boxtrail";
  const input = h("input", { id: "api-key", type: "password", name: "apiKey", required: true,
                             autocomplete: "off", spellcheck: "false", placeholder: "btk_…" });
  const status = h("p", { class: "error", role: "alert" }, message || "");
  const form = h("form", { class: "signin", onSubmit: async (event) => {
    event.preventDefault();
    status.textContent = "";
    try {
      session = await signIn(input.value.trim());
      input.value = "";
      await route();
    } catch (err) {
      status.textContent = err.status === 401 ? "That API key is not known." : err.message;
    }
  } },
    h("h1", {}, "boxtrail"),
    h("p", {}, "Paste an API key (", h("code", {}, "btk_…"), ") to sign in. ",
      "It is exchanged for a session cookie and not kept by this page."),
    h("label", { for: "api-key" }, "API key"), input,
    h("button", { type: "submit" }, "Sign in"), status);
  replace(root, h("main", { class: "center" }, form));
  input.focus();
}

function dispose() {
  if (current && current.dispose) current.dispose();
  current = null;
}

function header(projectName, tab) {
  const admin = session.scopes.includes("admin");
  const picker = h("select", { id: "project-picker", "aria-label": "Project", onChange: () => {
    navigate(picker.value ? ["p", picker.value, tab || "tail"] : ["projects"]);
  } }, h("option", { value: "" }, "All projects…"),
    projectList.map((p) => h("option", { value: p.name, selected: p.name === projectName }, p.name)));
  const nav = projectName
    ? h("nav", { "aria-label": "Views" }, TABS.map(([key, label]) =>
        h("a", { href: hashFor(["p", projectName, key]), class: key === tab ? "active" : null,
                 "aria-current": key === tab ? "page" : null }, label)))
    : h("nav", { "aria-label": "Views" });
  return h("header", { class: "top" },
    h("a", { class: "brand", href: "#/projects" }, "boxtrail"), picker, nav,
    admin || session.scopes.includes("usage:read")
      ? h("a", { href: "#/usage", id: "usage-link" }, "Tenant usage") : null,
    admin ? h("a", { href: "#/keys", id: "keys-link" }, "API keys") : null,
    h("span", { class: "who" }, session.tenantName),
    h("button", { type: "button", class: "small", id: "sign-out", onClick: async () => {
      try { await signOut(); } finally { showSignIn("Signed out."); }
    } }, "Sign out"));
}

async function route() {
  const seq = ++routeSeq;
  if (!session) {
    session = await currentSession();
    if (seq !== routeSeq) return;
    if (!session) return showSignIn();
  }
  const { path, params } = parseHash(location.hash);
  dispose();
  try {
    projectList = await get("/v1/projects");
  } catch (err) {
    if (err.status === 401) return;  // whenSignedOut shows the form
    projectList = [];
  }
  if (seq !== routeSeq) return;
  const ctx = { params, path, navigate, session, refreshProjects: async () => {
    projectList = await get("/v1/projects");
  } };
  if (Object.hasOwn(PAGES, path[0])) {
    current = PAGES[path[0]].render(ctx);
    return show(header(null, null), current.el);
  }
  if (path.length && !["p", "projects"].includes(path[0])) {
    return show(header(null, null), notFound(new ApiError(404, null)));
  }
  let view = projects;
  let tab = null;
  let projectName = null;
  if (path[0] === "p" && path[1]) {
    projectName = path[1];
    tab = path[2] || "setup";
    const found = TABS.find(([key]) => key === tab);
    try {
      ctx.project = await get(projectPath(projectName));
    } catch (err) {
      if (err.status === 401 || seq !== routeSeq) return;
      return show(header(null, null), notFound(err));
    }
    if (seq !== routeSeq) return;
    view = found ? found[2] : null;
    if (!view) return show(header(projectName, null), notFound(new ApiError(404, null)));
  }
  current = view.render(ctx);
  show(header(projectName, tab), current.el);
}

function notFound(err) {
  return h("section", { class: "panel" }, h("h1", {}, err.status === 404 ? "Not found" : "Error"),
    h("p", {}, err.status === 404 ? "There is no such project or view." : err.message),
    h("a", { href: "#/projects" }, "Back to projects"));
}

function show(top, body) {
  replace(root, top, h("main", { id: "view" }, body));
  // A new view: its heading gets the focus (and names the page), as a page load would.
  const heading = root.querySelector("main h1");
  if (heading) {
    heading.setAttribute("tabindex", "-1");
    heading.focus({ preventScroll: true });
    document.title = `${heading.textContent} · boxtrail`;
  }
}

whenSignedOut(() => showSignIn("Your session ended; sign in again."));
window.addEventListener("hashchange", () => { route(); });
route().catch((err) => replace(root, h("main", { class: "center" },
  h("p", { class: "error", role: "alert" }, `The console could not start: ${err.message}`))));
