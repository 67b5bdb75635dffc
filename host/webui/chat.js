// bloomery's chat page: conversations kept in the browser's localStorage, answers streamed from
// /v1/chat/completions, and views of /props, /slots and the expert counters of /metrics.
// Plain script, no build step; every text from the server or the user goes in as text, never
// as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE = { chats: "bloomery.chats", current: "bloomery.current", settings: "bloomery.settings" };
// Sampling fields: the request field each settings input sets, and whether it is an integer.
const SAMPLING = { temperature: false, top_k: true, top_p: false, min_p: false,
                   repeat_penalty: false, max_tokens: true, seed: true };

let chats = load(STORE.chats, []);
let settings = Object.assign({ system: "", tools: "", api_key: "" }, load(STORE.settings, {}));
let currentId = localStorage.getItem(STORE.current);
let running = null; // { controller, message } while an answer streams
const nodes = new WeakMap(); // message -> its element (kept out of the stored messages)
let serverTimer = null;
const fromServer = new Set(); // settings holding the server's default (--ui-config), not stored

function load(key, fallback) {
  try {
    const v = JSON.parse(localStorage.getItem(key));
    return v === null || v === undefined ? fallback : v;
  } catch {
    return fallback;
  }
}

function save() {
  localStorage.setItem(STORE.chats, JSON.stringify(chats));
  const own = Object.fromEntries(Object.entries(settings).filter(([f]) => !fromServer.has(f)));
  localStorage.setItem(STORE.settings, JSON.stringify(own));
  if (currentId) localStorage.setItem(STORE.current, currentId);
}

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function headers() {
  const h = { "Content-Type": "application/json" };
  if (settings.api_key) h.Authorization = "Bearer " + settings.api_key;
  return h;
}

// The folder the page is served from: "" at the root, "/api" under `--api-prefix /api`.
const BASE = location.pathname.replace(/\/(index\.html)?$/, "");

function api(path, options = {}) {
  return fetch(BASE + path, Object.assign({ headers: headers() }, options));
}

// The server's error as one line: "STATUS: message" from llama-server's error JSON.
async function errorText(res) {
  const text = await res.text();
  try {
    const e = JSON.parse(text).error;
    if (e && e.message) return `${res.status}: ${e.message}`;
  } catch { /* not JSON: the text as it came */ }
  return `${res.status}: ${text || res.statusText}`;
}

// ---- conversations

function current() {
  return chats.find((c) => c.id === currentId);
}

function newChat() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8),
              title: "New chat", messages: [] };
  chats.unshift(c);
  currentId = c.id;
  save();
  render();
  return c;
}

function renderChatList() {
  const list = $("chat-list");
  list.replaceChildren();
  for (const c of chats) {
    const li = el("li", c.id === currentId ? "current" : "");
    li.append(el("span", "", c.title));
    const del = el("button", "delete", "×");
    del.title = "delete this conversation";
    del.onclick = (ev) => {
      ev.stopPropagation();
      chats = chats.filter((x) => x !== c);
      if (currentId === c.id) currentId = chats.length ? chats[0].id : null;
      save();
      render();
    };
    li.append(del);
    li.onclick = () => { if (!running) { currentId = c.id; save(); render(); } };
    list.append(li);
  }
}

function timingsText(t) {
  const rate = (x) => (x > 0 ? x.toFixed(1) : "–");
  return `prompt ${t.prompt_n} tok, ${rate(t.prompt_per_second)} tok/s · cached ${t.cache_n} · ` +
         `decode ${t.predicted_n} tok, ${rate(t.predicted_per_second)} tok/s`;
}

// Fills a message's element from the message (called again on every streamed piece).
function fill(node, m, isLast) {
  const folded = node.querySelector("details.reasoning");
  const wasOpen = folded ? folded.open : false;
  node.replaceChildren();
  node.className = "msg " + m.role + (m.error ? " error" : "") + (m === running?.message ? " streaming" : "");
  node.append(el("div", "role", m.role));
  if (m.reasoning) {
    const d = el("details", "reasoning");
    d.open = wasOpen;
    d.append(el("summary", "", `Reasoning (${m.reasoning.length} characters)`), el("div", "", m.reasoning));
    node.append(d);
  }
  node.append(el("div", "content", m.content || ""));
  for (const call of m.tool_calls || []) {
    const box = el("div", "tool-call");
    let args = call.function.arguments;
    try { args = JSON.stringify(JSON.parse(args), null, 2); } catch { /* partial: as streamed */ }
    box.append(el("b", "", "tool call: " + call.function.name), document.createTextNode("\n" + args));
    node.append(box);
  }
  if (m.error) node.append(el("div", "error-text", m.error));
  const meta = el("div", "meta");
  if (m.stopped) meta.append(el("span", "stopped", "stopped"));
  if (m.timings) meta.append(el("span", "timings", timingsText(m.timings)));
  if (isLast && m.role !== "user" && !running) {
    const b = el("button", "regenerate", "Regenerate");
    b.onclick = regenerate;
    meta.append(b);
  }
  if (meta.childNodes.length) node.append(meta);
}

function renderMessages() {
  const box = $("messages");
  box.replaceChildren();
  const chat = current();
  if (!chat) return;
  chat.messages.forEach((m, i) => {
    const node = el("div");
    fill(node, m, i === chat.messages.length - 1);
    nodes.set(m, node);
    box.append(node);
  });
  box.scrollTop = box.scrollHeight;
}

function render() {
  renderChatList();
  renderMessages();
}

// ---- sending

function sampling() {
  const out = {};
  for (const [field, integer] of Object.entries(SAMPLING)) {
    const v = settings[field];
    if (v === undefined || v === "") continue;
    out[field] = integer ? parseInt(v, 10) : parseFloat(v);
  }
  return out;
}

// The conversation as the API takes it: the system prompt, then every message that is not an
// error alone.
function wire(chat) {
  const out = [];
  if (settings.system.trim()) out.push({ role: "system", content: settings.system });
  for (const m of chat.messages) {
    if (m === running?.message || (m.error && !m.content)) continue;
    const w = { role: m.role, content: m.content };
    if (m.tool_calls && m.tool_calls.length) w.tool_calls = m.tool_calls;
    out.push(w);
  }
  return out;
}

// Reads server-sent events, calling `onData` with each `data:` JSON until `[DONE]`.
async function readEvents(res, onData) {
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += decoder.decode(value, { stream: true });
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const frame = buf.slice(0, end);
      buf = buf.slice(end + 2);
      for (const line of frame.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        onData(JSON.parse(data));
      }
    }
  }
}

function applyDelta(m, chunk) {
  if (chunk.error) throw new Error(`${chunk.error.code || "error"}: ${chunk.error.message}`);
  if (chunk.timings) m.timings = chunk.timings;
  const d = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
  if (!d) return;
  if (d.reasoning_content) m.reasoning += d.reasoning_content;
  if (d.content) m.content += d.content;
  for (const t of d.tool_calls || []) {
    const i = t.index || 0;
    const call = (m.tool_calls[i] ||= { id: t.id, type: "function", function: { name: "", arguments: "" } });
    if (t.id) call.id = t.id;
    if (t.function?.name) call.function.name += t.function.name;
    if (t.function?.arguments) call.function.arguments += t.function.arguments;
  }
}

function setRunning(on) {
  $("send").hidden = on;
  $("stop").hidden = !on;
  $("new-chat").disabled = on;
}

async function generate(chat) {
  const body = Object.assign({ messages: wire(chat), stream: true }, sampling());
  const m = { role: "assistant", content: "", reasoning: "", tool_calls: [] };
  if (settings.tools.trim()) {
    try {
      body.tools = JSON.parse(settings.tools);
    } catch (e) {
      m.error = "the tools in Settings are not JSON: " + e.message;
    }
  }
  chat.messages.push(m);
  if (m.error) { save(); renderMessages(); return; }
  running = { controller: new AbortController(), message: m };
  setRunning(true);
  renderMessages();
  try {
    const res = await api("/v1/chat/completions", {
      method: "POST", body: JSON.stringify(body), signal: running.controller.signal });
    if (!res.ok) throw new Error(await errorText(res));
    await readEvents(res, (chunk) => {
      applyDelta(m, chunk);
      fill(nodes.get(m), m, true);
      $("messages").scrollTop = $("messages").scrollHeight;
    });
  } catch (e) {
    if (e.name === "AbortError") m.stopped = true;
    else m.error = e.message;
  } finally {
    running = null;
    setRunning(false);
    save();
    renderMessages();
    if (!$("server").hidden) refreshServer();
  }
}

function sendPrompt() {
  const text = $("prompt").value;
  if (running || !text.trim()) return;
  const chat = current() || newChat();
  chat.messages.push({ role: "user", content: text });
  if (chat.title === "New chat") chat.title = text.trim().slice(0, 40);
  $("prompt").value = "";
  renderChatList();
  generate(chat);
}

function regenerate() {
  const chat = current();
  if (running || !chat) return;
  while (chat.messages.length && chat.messages[chat.messages.length - 1].role !== "user") {
    chat.messages.pop();
  }
  generate(chat);
}

// ---- settings

function bindSettings() {
  const fields = ["system", "tools", "api_key", ...Object.keys(SAMPLING)];
  for (const f of fields) {
    const input = $("set-" + f);
    input.value = settings[f] ?? "";
    input.oninput = () => {
      settings[f] = input.value;
      fromServer.delete(f);
      if (f === "tools") checkTools();
      save();
    };
  }
  $("set-api_key").onchange = () => loadProps();
  checkTools();
}

function checkTools() {
  let why = "";
  if (settings.tools.trim()) {
    try { JSON.parse(settings.tools); } catch (e) { why = "tools: not JSON (" + e.message + ")"; }
  }
  $("settings-error").textContent = why;
}

// ---- the server

function setStatus(text, bad) {
  $("status").textContent = text;
  $("status").className = bad ? "bad" : "";
}

async function loadProps() {
  let res;
  try {
    res = await api("/props");
  } catch (e) {
    setStatus("the server cannot be reached: " + e.message, true);
    return setTimeout(loadProps, 2000);
  }
  if (res.status === 503) {
    setStatus("loading the model…");
    return setTimeout(loadProps, 1000);
  }
  if (res.status === 401) return setStatus("this server needs an API key: enter it in Settings", true);
  if (!res.ok) return setStatus(await errorText(res), true);
  const p = await res.json();
  setStatus("");
  $("model").textContent = p.model_alias || p.model_path;
  // The server's defaults for the page (--ui-config), under the page's own setting names; a
  // setting this browser has stored wins.
  const stored = load(STORE.settings, {});
  for (const [f, v] of Object.entries(p.ui_settings || {})) {
    const input = $("set-" + f);
    if (input && !(f in stored) && v !== null && typeof v !== "object") {
      settings[f] = String(v);
      input.value = settings[f];
      fromServer.add(f);
    }
  }
  const params = (p.default_generation_settings || {}).params || {};
  const defaults = { temperature: params.temperature, top_k: params.top_k, top_p: params.top_p,
                     min_p: params.min_p, repeat_penalty: params.repeat_penalty,
                     max_tokens: params.n_predict, seed: params.seed };
  for (const [f, v] of Object.entries(defaults)) {
    if (v !== undefined) $("set-" + f).placeholder = String(Math.round(v * 1e4) / 1e4);
  }
  const rows = [
    ["model", p.model_alias], ["file", p.model_path], ["slots", p.total_slots],
    ["context per slot", (p.default_generation_settings || {}).n_ctx], ["build", p.build_info],
    ["chat template", (p.chat_template || "").length + " characters"],
  ];
  const dl = $("props");
  dl.replaceChildren();
  for (const [k, v] of rows) dl.append(el("dt", "", k), el("dd", "", String(v ?? "–")));
}

async function refreshSlots() {
  const body = $("slots").tBodies[0];
  const res = await api("/slots");
  if (!res.ok) {
    body.replaceChildren(rowOf([await errorText(res)], 5));
    return;
  }
  body.replaceChildren(...(await res.json()).map((s) => rowOf([
    s.id, s.is_processing ? "busy" : "idle", s.n_cached ?? "–",
    s.next_token?.n_decoded ?? "–", s.next_token?.n_remain ?? "–"])));
}

function rowOf(cells, span) {
  const tr = el("tr");
  for (const c of cells) {
    const td = el("td", "", String(c));
    if (span) td.colSpan = span;
    tr.append(td);
  }
  return tr;
}

// Prometheus text as name -> value (the `llamacpp:` prefix dropped).
function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const [name, value] = line.trim().split(/\s+/);
    out[name.replace(/^llamacpp:/, "")] = Number(value);
  }
  return out;
}

async function refreshExperts() {
  const box = $("experts");
  const res = await api("/metrics");
  if (!res.ok) {
    box.replaceChildren(el("p", "hint", (await errorText(res)) +
      (res.status === 501 ? " (start the server with --metrics to see where experts ran)" : "")));
    return;
  }
  const m = parseMetrics(await res.text());
  const card = m.routed_experts_card_total || 0;
  const host = m.routed_experts_host_total || 0;
  const bus = m.routed_experts_bus_total || 0;
  const total = card + host;
  const share = total ? card / total : 0;
  const bar = el("div", "bar");
  const fillBar = el("div");
  fillBar.style.width = (100 * share).toFixed(1) + "%";
  bar.append(fillBar);
  const dl = el("dl");
  const rows = [
    ["served on the card", `${card} (${(100 * share).toFixed(1)}%)`],
    ["served in host RAM", `${host} (of which ${bus} read over PCIe by the card)`],
    ["moved onto the card", m.residency_flips_total ?? 0],
    ["read from disk", m.expert_disk_reads_total ?? 0],
    ["tokens decoded", m.tokens_predicted_total ?? 0],
    ["prompt tokens from cache", m.prompt_tokens_cache_total ?? 0],
  ];
  for (const [k, v] of rows) dl.append(el("dt", "", k), el("dd", "", String(v)));
  const note = el("p", "hint", total ? "Routed-expert calls of layers that keep experts in host RAM."
    : "No routed-expert calls on layers with host experts yet: every expert is on the card, " +
      "on the CPU, or the model is dense.");
  box.replaceChildren(bar, dl, note);
}

async function refreshServer() {
  try {
    await Promise.all([refreshSlots(), refreshExperts()]);
  } catch (e) {
    setStatus("the server cannot be reached: " + e.message, true);
  }
}

function toggle(panel) {
  const p = $(panel);
  p.hidden = !p.hidden;
  if (panel === "server") {
    clearInterval(serverTimer);
    if (!p.hidden) {
      loadProps();
      refreshServer();
      serverTimer = setInterval(refreshServer, 2000);
    }
  }
}

// ---- wiring

$("composer").onsubmit = (ev) => { ev.preventDefault(); sendPrompt(); };
$("prompt").onkeydown = (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); sendPrompt(); }
};
$("stop").onclick = () => running && running.controller.abort();
$("new-chat").onclick = () => newChat();
$("toggle-settings").onclick = () => toggle("settings");
$("toggle-server").onclick = () => toggle("server");
bindSettings();
if (!current()) currentId = chats.length ? chats[0].id : null;
render();
loadProps();
