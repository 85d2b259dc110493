// Live tail: the project's rows as they arrive, over Server-Sent Events (the session
// cookie authenticates it). Rows land in a bounded ring drawn as a virtual list (only
// the rows in view are in the DOM), at most once per animation frame, so thousands of
// rows a second cost the page a few DOM nodes per frame and a bounded heap.

import { get, projectPath } from "../api.js";
import { h, replace } from "../dom.js";
import { filterInputs, queryProblem, rowCells, rowDetails } from "./common.js";

export const RING = 5000;  // rows kept (and scrollable) in the view
const ROW_H = 24;  // px; must match .tail-row's height in console.css
const OVERSCAN = 10;

export function render(ctx) {
  const { params, project } = ctx;
  const filters = filterInputs(params, "tail");
  const ring = [];  // rows and dropped notices, oldest first
  let pending = [];  // arrived, not drawn yet
  let queue = [];  // arrived while paused
  let queued = 0;  // every row that arrived while paused (queue keeps the newest RING)
  let paused = false;
  let follow = true;
  let selected = null;
  let lastId = null;
  let source = null;
  let retry = null;
  let frame = 0;
  let closed = false;
  let received = 0;
  let elements = new Map();  // the rows drawn now -> their elements

  const status = h("span", { class: "status", id: "tail-status", role: "status" }, "connecting…");
  const pause = h("button", { type: "button", id: "tail-pause", onClick: () => togglePause() }, "Pause");
  const jump = h("button", { type: "button", class: "small jump", id: "tail-jump", hidden: true,
                            onClick: () => setFollow(true) }, "Jump to newest");
  const problem = h("div");
  const spacer = h("div", { class: "spacer" });
  const windowEl = h("div", { class: "window" });
  const viewport = h("div", { class: "tail-list", id: "tail-list", tabindex: "0", role: "log",
                              "aria-label": "Live rows (arrow keys select a row)", "aria-live": "off" }, spacer, windowEl);
  const detail = h("div", { class: "tail-detail", "aria-live": "polite", id: "tail-detail" }, h("p", { class: "muted" }, "Select a row to see its attributes and error."));
  const count = h("span", { class: "muted", id: "tail-count" }, "0 rows");

  const form = h("form", { class: "toolbar", onSubmit: (event) => {
    event.preventDefault();
    ctx.navigate(["p", project.name, "tail"], { q: filters.query.value.trim(), box: filters.box.value.trim() });
  } }, filters.nodes, h("button", { type: "submit" }, "Apply"), pause, status, count);

  // Scrolled up, the reader is reading: new rows wait (as when paused) so the rows in view
  // stay put; back at the bottom, or with "Jump to newest", they are appended.
  viewport.addEventListener("scroll", () => {
    const atBottom = viewport.scrollTop + viewport.clientHeight >= viewport.scrollHeight - ROW_H;
    if (atBottom !== follow) setFollow(atBottom);
    else schedule();
  });

  function setFollow(value) {
    follow = value;
    if (follow) release();
    draw(follow);
  }

  function togglePause() {
    paused = !paused;
    release();
    schedule();
  }

  /** The queued rows, appended once neither paused nor scrolled up. */
  function release() {
    if (paused || !follow) return updatePause();
    if (queued > queue.length) {
      pending.push({ notice: `${(queued - queue.length).toLocaleString()} rows arrived while the view was paused or scrolled up and are not shown here (the view keeps ${RING}); find them in Search.` });
    }
    pending.push(...queue);
    queue = [];
    queued = 0;
    updatePause();
  }

  function updatePause() {
    pause.textContent = paused ? `Resume (${queued.toLocaleString()} queued)` : "Pause";
    pause.setAttribute("aria-pressed", String(paused));
    jump.textContent = queued ? `Jump to newest (${queued.toLocaleString()} new)` : "Jump to newest";
  }

  function arrive(item) {
    if (paused || !follow) {
      queue.push(item);
      if (queue.length > RING) queue.splice(0, queue.length - RING);
      if (!item.notice) queued += 1;
    } else {
      pending.push(item);
      // Without frames (a hidden tab) rows wait here; past RING they would leave the
      // ring at the next draw anyway.
      if (pending.length > 2 * RING) pending.splice(0, pending.length - RING);
    }
    schedule();
  }

  function schedule() {
    if (!frame && !closed) frame = requestAnimationFrame(() => { frame = 0; draw(false); });
  }

  function draw(toBottom) {
    if (pending.length) {
      ring.push(...pending);
      pending = [];
      const excess = ring.length - RING;
      if (excess > 0) ring.splice(0, excess);
    }
    if (paused || !follow) updatePause();
    count.textContent = `${received.toLocaleString()} rows`;
    spacer.style.height = `${ring.length * ROW_H}px`;
    if (follow || toBottom) viewport.scrollTop = viewport.scrollHeight;
    const first = Math.max(0, Math.floor(viewport.scrollTop / ROW_H) - OVERSCAN);
    const last = Math.min(ring.length, first + Math.ceil(viewport.clientHeight / ROW_H) + 2 * OVERSCAN);
    windowEl.style.transform = `translateY(${first * ROW_H}px)`;
    // Keyed by row: the elements of rows still in view are kept, so following the bottom
    // removes the rows that left at the top and appends the new ones, nothing else.
    const shown = new Map();
    for (let i = first; i < last; i++) {
      const item = ring[i];
      const el = elements.get(item) || rowElement(item);
      el.classList.toggle("selected", item === selected);
      shown.set(item, el);
    }
    for (const [item, el] of elements) if (!shown.has(item)) el.remove();
    let at = windowEl.firstChild;
    for (const el of shown.values()) {
      if (el === at) at = at.nextSibling;
      else windowEl.insertBefore(el, at);
    }
    elements = shown;
    jump.hidden = follow;
  }

  // Rows are not tab stops (a virtual list would lose the focused one): the list is, and
  // its arrow keys move the selection, whose attributes show below it.
  function rowElement(item) {
    if (item.notice) return h("div", { class: "tail-row notice" }, item.notice);
    return h("div", { class: "tail-row", onClick: () => select(item) }, rowCells(item));
  }

  function select(item) {
    selected = item;
    replace(detail, item ? rowDetails(item) : null);
    draw(false);
  }

  viewport.addEventListener("keydown", (event) => {
    const step = { ArrowDown: 1, ArrowUp: -1, PageDown: 20, PageUp: -20 }[event.key];
    if (!step || !ring.length) return;
    event.preventDefault();
    let at = ring.indexOf(selected);
    if (at < 0) at = step > 0 ? Math.floor(viewport.scrollTop / ROW_H) - 1 : ring.length;
    const next = Math.max(0, Math.min(ring.length - 1, at + step));
    const top = next * ROW_H;
    if (top < viewport.scrollTop) viewport.scrollTop = top;
    else if (top + ROW_H > viewport.scrollTop + viewport.clientHeight) {
      viewport.scrollTop = top + ROW_H - viewport.clientHeight;
    }
    select(ring[next]);
  });

  async function open() {
    const q = params.get("q") || "";
    const box = params.get("box") || "";
    if (q) {  // the tail's query is checked first: a 400 gives the error at its position
      try {
        await get(projectPath(project.name, "/logs"), { since: "1s", limit: 1, query: q, boxId: box });
      } catch (err) {
        if (err.status === 400) {
          replace(problem, queryProblem(err));
          status.textContent = "not started";
          return;
        }
      }
    }
    connect();
  }

  function connect() {
    if (closed) return;
    const url = new URL(projectPath(project.name, "/tail"), location.origin);
    if (params.get("q")) url.searchParams.set("query", params.get("q"));
    if (params.get("box")) url.searchParams.set("boxId", params.get("box"));
    if (lastId) url.searchParams.set("lastEventId", lastId);  // a new EventSource: resume
    source = new EventSource(url);
    source.addEventListener("open", () => { status.textContent = "live"; status.className = "status live"; });
    source.addEventListener("log", (event) => {
      lastId = event.lastEventId || lastId;
      received += 1;
      let row;
      try { row = JSON.parse(event.data); } catch { row = { notice: `unreadable row ${event.lastEventId}` }; }
      arrive(row);
    });
    source.addEventListener("dropped", (event) => {
      lastId = event.lastEventId || lastId;
      let n = "some";
      try { n = JSON.parse(event.data).count.toLocaleString(); } catch { /* keep "some" */ }
      arrive({ notice: `${n} rows skipped: this tail fell too far behind (they are stored; see Search).` });
    });
    source.addEventListener("error", () => {
      // The browser reconnects by itself (sending Last-Event-ID) unless the server
      // answered with an error; then it is closed and we open a new one after a pause.
      status.className = "status down";
      status.textContent = "reconnecting…";
      if (source.readyState === EventSource.CLOSED) {
        source.close();
        retry = setTimeout(async () => {
          try { await get("/v1/session"); } catch (err) { if (err.status === 401) return; }
          connect();
        }, 2000);
      }
    });
  }

  open();
  return {
    el: h("section", { class: "tail" }, h("h1", { class: "sr-only" }, `Live tail of ${project.name}`),
      form, problem, h("div", { class: "tail-frame" }, viewport, jump), detail),
    dispose() {
      closed = true;
      if (source) source.close();
      clearTimeout(retry);
      cancelAnimationFrame(frame);
    },
  };
}
