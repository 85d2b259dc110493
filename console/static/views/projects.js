// Projects: the tenant's list, and a form that creates one.

import { request } from "../api.js";
import { h, replace, table } from "../dom.js";
import { ago } from "../format.js";

export function render(ctx) {
  const list = h("div", { class: "project-list" });
  const name = h("input", { id: "new-project-name", name: "name", required: true,
                            pattern: "[A-Za-z0-9][A-Za-z0-9._\\-]{0,63}", autocomplete: "off" });
  const origins = h("textarea", { id: "new-project-origins", name: "allowedOrigins", rows: 3,
                                  placeholder: "https://*.box.example.com" });
  const status = h("p", { class: "error", role: "alert" });
  const form = h("form", { class: "panel", onSubmit: async (event) => {
    event.preventDefault();
    status.textContent = "";
    const allowedOrigins = origins.value.split(/[\s,]+/).filter(Boolean);
    try {
      const { data } = await request("POST", "/v1/projects",
                                     { body: { name: name.value.trim(), allowedOrigins } });
      await ctx.refreshProjects();
      ctx.navigate(["p", data.name, "setup"]);
    } catch (err) {
      status.textContent = err.message;
    }
  } },
    h("h2", {}, "New project"),
    h("label", { for: "new-project-name" }, "Name"), name,
    h("label", { for: "new-project-origins" },
      "Allowed origins (one per line; empty: any page may send with the key)"), origins,
    h("button", { type: "submit" }, "Create project"), status);

  load();
  async function load() {
    const { data } = await request("GET", "/v1/projects");
    if (!data.length) {
      replace(list, h("p", { class: "muted" }, "No projects yet: create the first one below."));
      return;
    }
    replace(list, table({}, ["Project", "Id", "Created"], data.map((p) => h("tr", {},
        h("td", {}, h("a", { href: `#/p/${encodeURIComponent(p.name)}/tail` }, p.name)),
        h("td", {}, h("code", {}, p.id)),
        h("td", { title: p.createdAt }, ago(p.createdAt))))));
  }

  return { el: h("section", {}, h("h1", {}, "Projects"), list, form) };
}
