// API keys: the tenant's, made (shown once), listed and revoked. Needs an admin key.

import { request } from "../api.js";
import { copyButton, h, replace, table } from "../dom.js";
import { ago } from "../format.js";

const SCOPES = ["read", "sourcemaps:write", "usage:read", "admin"];

export function render() {
  const list = h("div", {});
  const status = h("p", { role: "status", id: "keys-status" });
  const name = h("input", { id: "new-key-name", name: "name", autocomplete: "off" });
  const boxes = SCOPES.map((s) => h("input", { type: "checkbox", id: `scope-${s}`, value: s }));
  const days = h("input", { id: "new-key-days", type: "number", min: 1, placeholder: "never" });
  const form = h("form", { class: "panel", onSubmit: async (event) => {
    event.preventDefault();
    const body = { name: name.value.trim(), scopes: boxes.filter((b) => b.checked).map((b) => b.value) };
    if (days.value) body.expiresIn = Number(days.value) * 86400;
    try {
      const { data } = await request("POST", "/v1/keys", { body });
      replace(status, "New key (shown once): ", h("code", { id: "new-key" }, data.key), " ",
              copyButton(data.key));
      await load();
    } catch (err) {
      status.textContent = err.message;
    }
  } },
    h("h2", {}, "New API key"),
    h("label", { for: "new-key-name" }, "Name"), name,
    h("fieldset", {}, h("legend", {}, "Scopes"),
      boxes.map((b) => h("label", { for: b.id }, b, ` ${b.value}`))),
    h("label", { for: "new-key-days" }, "Expires after (days)"), days,
    h("button", { type: "submit" }, "Create key"));

  async function load() {
    const { data } = await request("GET", "/v1/keys");
    replace(list, table({}, ["Name", "Key", "Scopes", "Created", "Expires", "Last used", ""],
      data.map((k) => {
        const revoke = h("button", { type: "button", class: "small danger", onClick: async () => {
          if (revoke.dataset.armed !== "1") {
            revoke.dataset.armed = "1";
            revoke.textContent = "Really revoke?";
            return;
          }
          try {
            await request("DELETE", `/v1/keys/${encodeURIComponent(k.id)}`);
            status.textContent = `Revoked ${k.name || k.prefix}.`;
            await load();
          } catch (err) {
            status.textContent = err.message;
          }
        } }, "Revoke");
        return h("tr", { id: k.id },
          h("td", {}, k.name || "–"), h("td", {}, h("code", {}, `${k.prefix}…`)),
          h("td", {}, k.scopes.join(", ")), h("td", { title: k.createdAt }, ago(k.createdAt)),
          h("td", {}, k.expiresAt || "never"),
          h("td", {}, k.lastUsedAt ? ago(k.lastUsedAt) : "never"), h("td", {}, revoke));
      })));
  }

  load().catch((err) => replace(list, h("p", { class: "error", role: "alert" }, err.message)));
  return { el: h("section", {}, h("h1", {}, "API keys"), status, list, form) };
}
