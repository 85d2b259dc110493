// DOM building without markup: every string becomes a text node, so nothing stored in a
// log (a message, an attribute, a file name) can ever become HTML or script here.

const SVG = "http://www.w3.org/2000/svg";
// Characters that reorder the text around them (embeddings, overrides, isolates, marks):
// a stored "r\u202e1" would display as something else. They are shown as <U+202E>.
const BIDI = /[\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

export function reveal(text) {
  return text.replace(BIDI, (c) => `<U+${c.charCodeAt(0).toString(16).toUpperCase()}>`);
}

function build(el, props, children) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) {
      if (typeof value !== "function") throw new TypeError(`${key} must be a function`);
      el.addEventListener(key.slice(2).toLowerCase(), value);
    } else if (key === "href" && !/^[#/]/.test(String(value))) {
      throw new TypeError(`href must be a path of this console, not ${value}`);
    } else if (key === "class") {
      el.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    } else if (key === "value" || key === "checked") {
      el[key] = value;
    } else {
      el.setAttribute(key, value === true ? "" : String(value));
    }
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(reveal(String(child))));
  }
  return el;
}

/** h("a", {href: "#/x", onClick: f}, "text", otherNode) */
export function h(tag, props, ...children) {
  return build(document.createElement(tag), props, children);
}

export function svg(tag, props, ...children) {
  return build(document.createElementNS(SVG, tag), props, children);
}

export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** A table: the column headings, then the rows (each a <tr>). */
export function table(props, heads, rows) {
  return h("table", props, h("thead", {}, h("tr", {}, heads.map((c) => h("th", { scope: "col" }, c)))),
           h("tbody", {}, rows));
}

/** A button that copies `text()` to the clipboard and says so. */
export function copyButton(text, label = "Copy") {
  const button = h("button", { type: "button", class: "small" }, label);
  button.addEventListener("click", async () => {
    const value = typeof text === "function" ? text() : text;
    try {
      await navigator.clipboard.writeText(value);
      button.textContent = "Copied";
    } catch {
      button.textContent = "Select and copy";  // no clipboard API (plain http, old browser)
    }
    setTimeout(() => { button.textContent = label; }, 1500);
  });
  return button;
}
