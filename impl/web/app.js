// The miserver web UI: one script, no build step, only the documented HTTP API
// (REQ-003 GEN-02/03, SEC-09..11, SEC-28..35, SEC-40, SECN-08). Model output is
// never parsed as HTML: the Markdown below builds DOM nodes from a whitelist,
// and every piece of model text lands in a text node.

const KEY_STORE = "miserver.key";
const $ = (id) => document.getElementById(id);

// -- the API, with the key (SEC-09..11) ------------------------------------------

let keyWaiters = null;

function keyHeaders(extra = {}) {
  const key = localStorage.getItem(KEY_STORE);
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

function askForKey(why) {
  if (!keyWaiters) {
    keyWaiters = [];
    $("key-why").textContent = why;
    $("key").value = "";
    $("key-dialog").showModal();
  }
  return new Promise((resolve) => keyWaiters.push(resolve));
}

$("key-form").addEventListener("submit", () => {
  localStorage.setItem(KEY_STORE, $("key").value.trim());
  const waiting = keyWaiters || [];
  keyWaiters = null;
  waiting.forEach((resolve) => resolve());
});

async function api(path, options = {}) {
  const sent = localStorage.getItem(KEY_STORE);
  const init = { ...options, headers: keyHeaders(options.headers || {}) };
  if (init.json !== undefined) init.body = JSON.stringify(init.json);
  delete init.json;
  const method = (init.method || "GET").toUpperCase();
  if (method !== "GET" && method !== "HEAD") init.headers["Content-Type"] = "application/json"; // every other method is JSON
  const response = await fetch(path, init);
  if (response.status === 401) {
    const body = await response.json().catch(() => ({}));
    // a 401 to a request sent before the key was entered retries with that key, rather
    // than asking again over a page that has its key
    if (localStorage.getItem(KEY_STORE) === sent) {
      await askForKey(body?.error?.message || "This server needs its API key.");
    }
    return api(path, options);
  }
  return response;
}

async function apiJson(path, options = {}) {
  const response = await api(path, options);
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body?.error?.message || `${response.status} ${path}`);
  return body;
}

function showError(error) {
  const box = $("error");
  box.textContent = error ? String(error.message || error) : "";
  box.hidden = !error;
}

// -- server-sent events over fetch (the key rides along: SEC-11) -------------------

async function* sse(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let event = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) yield { event, data: data.join("\n") };
    }
  }
}

const listeners = {};
function on(event, handler) {
  (listeners[event] ||= []).push(handler);
}

async function followEvents() {
  for (let wait = 500; ; wait = Math.min(wait * 2, 10000)) {
    try {
      const response = await api("/api/events");
      if (response.ok) {
        wait = 500;
        for await (const { event, data } of sse(response)) {
          const parsed = JSON.parse(data);
          (listeners[event] || []).forEach((handler) => handler(parsed));
        }
      }
    } catch (error) {
      // the stream ended or the server went away: try again after a wait
    }
    await new Promise((resolve) => setTimeout(resolve, wait));
  }
}

// -- safe Markdown (SEC-28..35, SECN-08) -------------------------------------------

const IMAGE_TYPES = /^data:image\/(png|gif|jpeg|webp);base64,[A-Za-z0-9+/=\s]*$/i;
const LINK_SCHEMES = new Set(["http:", "https:", "mailto:"]);

function el(tag, children = [], attributes = {}) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  for (const child of children) node.append(child);
  return node;
}

function safeLink(url) {
  try {
    const parsed = new URL(url);
    return LINK_SCHEMES.has(parsed.protocol) ? parsed.href : null;
  } catch {
    return null;
  }
}

// Inline Markdown: code spans, images, links, autolinks, strong, emphasis, breaks.
// Anything else, raw HTML included, is text.
const INLINE = [
  [/^`([^`]+)`/, (m) => el("code", [m[1]])],
  [/^!\[([^\]]*)\]\(([^)\s]*)[^)]*\)/, (m) => image(m[1], m[2])],
  [/^\[([^\]]+)\]\(([^)\s]*)[^)]*\)/, (m) => link(inline(m[1]), m[2])],
  [/^<((?:https?|mailto):[^>\s]+)>/, (m) => link([m[1]], m[1])],
  [/^(\*\*|__)(?=\S)([\s\S]*?\S)\1/, (m) => el("strong", inline(m[2]))],
  [/^(\*|_)(?=\S)([\s\S]*?\S)\1/, (m) => el("em", inline(m[2]))],
  [/^ {2,}\n|^\\\n/, () => el("br")],
];

function image(alt, url) {
  if (IMAGE_TYPES.test(url)) return el("img", [], { src: url.replace(/\s/g, ""), alt });
  return el("span", [alt], { class: "alt" }); // any other image: its alt text (SEC-32)
}

function link(children, url) {
  const href = safeLink(url);
  if (!href) return el("span", children);
  return el("a", children, { href, target: "_blank", rel: "noopener noreferrer", referrerpolicy: "no-referrer" });
}

function inline(text) {
  const out = [];
  let plain = "";
  while (text) {
    let matched = false;
    for (const [pattern, make] of INLINE) {
      const m = pattern.exec(text);
      if (m) {
        if (plain) out.push(plain);
        plain = "";
        out.push(make(m));
        text = text.slice(m[0].length);
        matched = true;
        break;
      }
    }
    if (!matched) {
      plain += text[0];
      text = text.slice(1);
    }
  }
  if (plain) out.push(plain);
  return out;
}

// Block Markdown: fenced code, headings, rules, quotes, lists, paragraphs.
function render(markdown) {
  const fragment = document.createDocumentFragment();
  const lines = markdown.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  const para = [];
  const flush = () => {
    if (para.length) fragment.append(el("p", inline(para.join("\n"))));
    para.length = 0;
  };
  while (i < lines.length) {
    const line = lines[i];
    let m;
    if ((m = /^\s*(```|~~~)\s*([\w+-]*)/.exec(line))) {
      flush();
      const body = [];
      for (i += 1; i < lines.length && !lines[i].trimStart().startsWith(m[1]); i += 1) body.push(lines[i]);
      i += 1;
      const code = el("code", [body.join("\n")]);
      if (m[2]) code.dataset.lang = m[2];
      fragment.append(el("pre", [code]));
      continue;
    }
    if ((m = /^(#{1,6})\s+(.*)$/.exec(line))) {
      flush();
      fragment.append(el(`h${m[1].length}`, inline(m[2].replace(/\s#+\s*$/, ""))));
    } else if (/^\s*([-*_])(\s*\1){2,}\s*$/.test(line)) {
      flush();
      fragment.append(el("hr"));
    } else if (/^\s*>/.test(line)) {
      flush();
      const quoted = [];
      for (; i < lines.length && /^\s*>/.test(lines[i]); i += 1) quoted.push(lines[i].replace(/^\s*> ?/, ""));
      fragment.append(el("blockquote", [render(quoted.join("\n"))]));
      continue;
    } else if ((m = /^\s*([-*+]|\d+[.)])\s+/.exec(line))) {
      flush();
      const ordered = /\d/.test(m[1]);
      const items = [];
      for (; i < lines.length; i += 1) {
        const item = /^\s*([-*+]|\d+[.)])\s+(.*)$/.exec(lines[i]);
        if (item && /\d/.test(item[1]) === ordered) items.push(el("li", inline(item[2])));
        else if (lines[i].trim() && items.length && /^\s{2,}/.test(lines[i])) items[items.length - 1].append("\n", ...inline(lines[i].trim()));
        else break;
      }
      fragment.append(el(ordered ? "ol" : "ul", items));
      continue;
    } else if (!line.trim()) {
      flush();
    } else {
      para.push(line);
    }
    i += 1;
  }
  flush();
  return fragment;
}

// -- the conversation ----------------------------------------------------------------

const conversation = [];
let running = null; // the AbortController of the reply being streamed
let lastView = null; // the last assistant turn's nodes, which Continue extends

function bubble(role) {
  const body = el("div", [], { class: "body" });
  const reasoning = el("details", [el("summary", ["Reasoning"])], { class: "reasoning", hidden: "" });
  const calls = el("div", [], { class: "calls" });
  const meta = el("div", [], { class: "meta" });
  const node = el("article", [reasoning, body, calls, meta], { class: `turn ${role}` });
  $("chat").append(node);
  return { node, body, reasoning, calls, meta };
}

function showTurn(message) {
  const view = bubble(message.role);
  view.body.append(message.role === "assistant" ? render(message.content || "") : message.content);
  return view;
}

function setRunning(controller) {
  running = controller;
  $("send").disabled = Boolean(controller);
  $("stop").disabled = !controller;
  const answered = conversation.at(-1)?.role === "assistant";
  $("regenerate").disabled = Boolean(controller) || !answered;
  $("continue").disabled = Boolean(controller) || !answered;
}

// `continuing`: the last assistant message goes as a partial answer to continue (a
// trailing assistant message, OAI-CONT-01), and the reply extends its turn.
async function reply(continuing = false) {
  const model = $("model").value || undefined;
  const view = continuing && lastView ? lastView : bubble("assistant");
  lastView = view;
  const controller = new AbortController();
  setRunning(controller);
  let content = continuing ? conversation.at(-1).content : "";
  let reasoning = "";
  const calls = {};
  let painting = false;
  const paint = () => {
    if (painting) return;
    painting = true;
    requestAnimationFrame(() => {
      painting = false;
      view.body.replaceChildren(render(content));
    });
  };
  try {
    const body = { model, messages: conversation, stream: true, stream_options: { include_usage: true } };
    if ($("show-activations").checked) {
      body.return_sae_activations = { positions: "all", top_k: 5 }; // the prompt's tokens too
    }
    const response = await api("/v1/chat/completions", {
      method: "POST",
      json: body,
      signal: controller.signal,
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error(body?.error?.message || `${response.status}`);
    }
    const steering = response.headers.get("X-miLLM-Steering");
    if (steering) view.meta.append(el("span", [`Steering: ${steering}`], { class: "steering" }));
    let activations = null;
    let promptTokens = 0;
    for await (const { data } of sse(response)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.millm?.sae_activations) activations = chunk.millm.sae_activations;
      if (chunk.usage?.prompt_tokens) promptTokens = chunk.usage.prompt_tokens;
      if (chunk.millm_probe_verdicts) {
        view.calls.after(el("ul", chunk.millm_probe_verdicts.map((v) =>
          el("li", [`${v.probe}: ${v.verdict} (${v.outcome}) — ${v.reason}`], { "data-outcome": v.outcome })), { class: "verdicts" }));
      }
      if (chunk.millm_steering) view.meta.replaceChildren(el("span", [`Steering: ${chunk.millm_steering}`], { class: "steering" }));
      const delta = chunk.choices?.[0]?.delta || {};
      if (delta.reasoning_content) {
        reasoning += delta.reasoning_content;
        view.reasoning.hidden = false;
        view.reasoning.replaceChildren(el("summary", ["Reasoning"]), el("div", [reasoning]));
      }
      for (const call of delta.tool_calls || []) {
        const held = (calls[call.index] ||= { name: "", arguments: "" });
        held.name += call.function?.name || "";
        held.arguments += call.function?.arguments || "";
      }
      if (delta.content) {
        content += delta.content;
        paint(); // once a frame at most: a long reply is not parsed again for every token
      }
      view.calls.replaceChildren(
        ...Object.values(calls).map((c) => el("div", [el("code", [`${c.name}(${c.arguments})`])], { class: "tool-call" })),
      );
    }
    view.body.replaceChildren(render(content)); // the whole reply, whatever frame is pending
    if (activations?.positions.length) {
      const ids = activations.positions.map((p) => p.token_id);
      const { pieces } = await apiJson("/api/detokenize", { method: "POST", json: { tokens: ids } });
      view.node.append(heatmap(activations, pieces, promptTokens));
    }
  } catch (error) {
    if (error.name !== "AbortError") showError(error);
  } finally {
    if (continuing) conversation.at(-1).content = content;
    else conversation.push({ role: "assistant", content });
    setRunning(null);
  }
}

// -- the activation heatmap: a reply's tokens coloured by a chosen feature ----------

// `pieces`: each position's token text (POST /api/detokenize); positions before
// `promptTokens` are the prompt's. The features are offered by their weight on the
// reply (the sum of their values over its tokens), the heaviest first. The shades
// are scaled to the chosen feature's largest value past the first token: models
// pile activation on the first position (an attention sink), which would otherwise
// leave every other token unshaded; the first token is shaded at most 5.
function heatmap(activations, pieces, promptTokens) {
  const positions = activations.positions;
  const weight = new Map();
  for (const p of positions) {
    for (const f of p.features) {
      const onReply = p.position >= promptTokens ? Math.abs(f.value) : 0;
      weight.set(f.index, (weight.get(f.index) || 0) + onReply);
    }
  }
  const features = [...weight.keys()].sort((a, b) => weight.get(b) - weight.get(a) || a - b);
  const chosen = el("select", features.map((f) => el("option", [`feature ${f}`], { value: String(f) })), { class: "feature" });
  const scale = el("span", [], { class: "note scale" });
  const row = el("div", [], { class: "tokens" });
  const paint = () => {
    const index = Number(chosen.value);
    const values = positions.map((p) => p.features.find((f) => f.index === index)?.value || 0);
    const past = values.filter((_, i) => positions[i].position > 0).map(Math.abs);
    const top = Math.max(...(past.some((v) => v > 0) ? past : values.map(Math.abs)), 1e-9);
    scale.textContent = ` darkest at ${top.toFixed(2)} and above`;
    row.replaceChildren(
      ...positions.map((p, i) => {
        const span = el("span", [pieces[i]], {
          class: p.position < promptTokens ? "token prompt" : "token",
          "data-value": values[i].toFixed(3),
          "data-level": String(Math.min(5, Math.round((Math.abs(values[i]) / top) * 5))), // 0..5: the stylesheet's shades
          title: p.features.map((f) => `feature ${f.index}: ${f.value.toFixed(3)}`).join("\n"),
        });
        return span;
      }),
    );
  };
  chosen.addEventListener("change", paint);
  paint();
  return el("div", [el("div", [`SAE ${activations.sae_id} at layer ${activations.layer}: `, chosen, scale], { class: "meta" }), row], { class: "heatmap" });
}

$("ask").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || running) return;
  $("prompt").value = "";
  showError(null);
  const message = { role: "user", content: text };
  conversation.push(message);
  showTurn(message);
  reply();
});

$("stop").addEventListener("click", () => running?.abort());

$("continue").addEventListener("click", () => {
  if (running || conversation.at(-1)?.role !== "assistant") return;
  showError(null);
  reply(true);
});

$("regenerate").addEventListener("click", () => {
  if (running || conversation.at(-1)?.role !== "assistant") return;
  conversation.pop();
  $("chat").lastElementChild?.remove();
  reply();
});

$("clear").addEventListener("click", () => {
  running?.abort();
  conversation.length = 0;
  lastView = null;
  $("chat").replaceChildren();
  setRunning(null);
});

// -- models, state, rate and memory ------------------------------------------------

async function listModels() {
  const [models, info] = await Promise.all([apiJson("/v1/models"), apiJson("/api/info")]);
  const current = info.model?.id;
  $("model").replaceChildren(
    ...models.data.map((m) => el("option", [m.id], m.id === current ? { value: m.id, selected: "" } : { value: m.id })),
  );
  showState(info);
}

let threads = 1; // the engine's own thread count, from /api/info (INFO-22), never the parameters

function showState(info) {
  const words = { ready: "Ready", loading: "Loading…", planning: "Planning…", error: "Error", empty: "No model" };
  $("state").textContent = words[info.state] || info.state;
  $("state").dataset.state = info.state;
  const model = info.state === "ready" ? info.model : null;
  threads = model?.busy_threads || model?.compute_threads || 1;
  // nothing about streaming before a model has loaded (INFO-21); once one has, say it
  // runs plainly when it does not stream (INFO-20)
  $("engine").textContent = !model
    ? ""
    : model.streaming
      ? `${model.engine}, streaming experts`
      : model.engine === "llama.cpp"
        ? "plain llama.cpp (mmap), no expert streaming"
        : `plain ${model.engine}, no expert streaming`;
  if (info.error) showError(info.error);
}

$("load").addEventListener("click", async () => {
  try {
    showError(null);
    await apiJson("/api/session/load", { method: "POST", json: { model: $("model").value } });
  } catch (error) {
    showError(error);
  }
});

$("unload").addEventListener("click", async () => {
  try {
    await apiJson("/api/session/unload", { method: "POST", json: {} });
  } catch (error) {
    showError(error);
  }
});

on("state", (info) => {
  showState(info);
  if (info.model?.id) $("model").value = info.model.id;
});
on("done", (done) => {
  if (done.tok_s) $("rate").textContent = `${done.tok_s.toFixed(1)} tokens/s`;
  $("flash").textContent = done.flash_wait_s_tok > 0 ? `flash ${Math.round(done.flash_wait_s_tok * 1000)} ms a token` : "";
});
on("token", (token) => {
  if (token.rss_mib) $("memory").textContent = `${Math.round(token.rss_mib)} MiB`;
  if (token.wall_ms > 0) $("cpu").textContent = `CPU ${Math.round((100 * token.cpu_ms) / (token.wall_ms * threads))}%`;
  // "flash" from flash_wait_* alone, whatever the session's mode (EVENTS-30)
  $("flash").textContent = token.flash_wait_ms > 0 ? `flash ${Math.round(token.flash_wait_ms)} ms` : "";
});


// -- views -----------------------------------------------------------------------------

for (const button of document.querySelectorAll("nav.views button")) {
  button.addEventListener("click", () => {
    for (const other of document.querySelectorAll("nav.views button")) {
      other.setAttribute("aria-pressed", String(other === button));
      $(other.dataset.view).hidden = other !== button;
    }
    if (button.dataset.view === "settings-view") showSettings().catch(showError);
    if (button.dataset.view === "models-view") showModels().catch(showError);
    if (button.dataset.view === "steering-view") showSteering().catch(showError);
  });
}

// -- settings from /api/params and /api/config (PARAMS-22/23) ----------------------

let table = null;

function special(param, value) {
  return (param.special || []).find((s) => String(s.value) === String(value));
}

function input(param, value) {
  let field;
  if (param.type === "bool") {
    field = el("input", [], { type: "checkbox" });
    field.checked = Boolean(value);
  } else if (param.type === "choice") {
    field = el("select", (param.choices || []).map((c) => el("option", [c.label], { value: String(c.value) })));
    field.value = String(value);
  } else {
    const numeric = param.type === "int" || param.type === "float";
    field = el("input", [], { type: numeric && !param.accepts_auto ? "number" : "text" });
    if (numeric && param.min !== undefined) field.min = param.min;
    if (numeric && param.max !== undefined) field.max = param.max;
    if (param.type === "float") field.step = "any";
    field.value = value === null || value === undefined ? "" : String(value);
  }
  field.id = `param-${param.key}`;
  field.dataset.key = param.key;
  field.addEventListener("change", () => setParam(param, field));
  return field;
}

function parsed(param, field) {
  if (param.type === "bool") return field.checked;
  if (param.type === "int" || param.type === "float") {
    if (param.accepts_auto && field.value.trim() === "auto") return "auto";
    const number = Number(field.value);
    return field.value.trim() === "" || Number.isNaN(number) ? field.value : number;
  }
  return field.value;
}

async function setParam(param, field) {
  const change = await apiJson("/api/config", { method: "PUT", json: { values: { [param.key]: parsed(param, field) } } });
  const rejected = Object.entries(change.rejected || {});
  $("rejected").hidden = rejected.length === 0;
  $("rejected").textContent = rejected.map(([key, why]) => `${key}: ${why}`).join("; ");
  showConfig(change);
}

function describe(param, value) {
  const words = [];
  const named = special(param, value);
  if (named) words.push(named.label); // a special value's label in place of its number
  if (param.typical) words.push(`typical ${param.typical.min}–${param.typical.max}${param.unit ? " " + param.unit : ""}`);
  if (param.scope === "session") words.push("applies at the next load");
  return words.join(" · ");
}

function showConfig(config) {
  $("reload").hidden = !config.reload_required;
  for (const param of table || []) {
    const note = $(`note-${param.key}`);
    if (note) note.textContent = describe(param, config.values[param.key]);
  }
}

async function showSettings() {
  const [params, config] = await Promise.all([apiJson("/api/params"), apiJson("/api/config")]);
  table = params;
  const all = $("show-all").checked;
  const groups = new Map();
  for (const param of params) {
    if (!all && (param.level === "experimental" || param.level === "debug")) continue;
    if (!groups.has(param.group_label)) groups.set(param.group_label, []);
    const value = config.values[param.key];
    groups.get(param.group_label).push(
      el("div", [
        el("label", [param.label], { for: `param-${param.key}`, title: param.help }),
        input(param, value),
        el("span", [describe(param, value)], { id: `note-${param.key}`, class: "note" }),
      ], { class: "param" }),
    );
  }
  $("params").replaceChildren(...[...groups].map(([label, rows]) => el("fieldset", [el("legend", [label]), ...rows])));
  showConfig(config);
}

$("show-all").addEventListener("change", () => showSettings().catch(showError));
on("config", (config) => showConfig(config));

// -- the plan (EVENTS-25: the step's label is shown; the step is protocol) ----------

function showPlan(plan) {
  if (!plan.values) {
    $("plan").replaceChildren(el("p", [plan.error || plan.reason || "No plan yet."]));
    $("plan-apply").disabled = true;
    return;
  }
  const decisions = plan.decisions.map((d) =>
    el("li", [el("strong", [d.label]), `: ${d.value_text} — `, d.brief], { "data-group": d.group }),
  );
  $("plan").replaceChildren(
    el("p", [plan.machine], { class: "machine" }),
    el("p", [plan.summary.sentence]),
    ...(plan.warning ? [el("p", [plan.warning], { class: "notice" })] : []),
    el("ul", decisions),
  );
  $("plan-apply").disabled = false;
}

$("plan-make").addEventListener("click", async () => {
  try {
    $("plan-make").disabled = true;
    showPlan(await apiJson("/api/plan?measure=1"));
  } catch (error) {
    showError(error);
  } finally {
    $("plan-make").disabled = false;
    $("plan-progress").textContent = "";
  }
});

$("plan-apply").addEventListener("click", async () => {
  try {
    showConfig(await apiJson("/api/plan/apply", { method: "POST", json: {} }));
    await showSettings();
  } catch (error) {
    showError(error);
  }
});

on("plan_progress", (progress) => {
  $("plan-progress").textContent = progress.label || "";
});

// -- models: on disk, the catalog and its downloads, Hugging Face (MODELS-27/38/39) --

const gb = (bytes) => (bytes / 1e9).toFixed(bytes < 10e9 ? 2 : 1); // decimal GB
const downloads = {}; // the last `download` event of each entry

function button(label, action, attributes = {}) {
  const node = el("button", [label], { type: "button", ...attributes });
  node.addEventListener("click", () => action().catch(showError));
  return node;
}

function entryActions(entry) {
  const live = downloads[entry.id];
  if (entry.status === "on_disk") return [el("span", ["On disk"], { class: "note" })];
  if (entry.status === "downloading" || live?.state === "running" || live?.state === "retrying") {
    const received = live?.received ?? entry.received;
    const words = [`${gb(received)} of ${gb(entry.bytes)} GB`];
    if (live?.bytes_per_s) words.push(`${(live.bytes_per_s / 1e6).toFixed(1)} MB/s`);
    if (live?.retry_in_s) words.push(`retrying in ${live.retry_in_s} s`);
    return [
      el("progress", [], { max: String(entry.bytes), value: String(received) }),
      el("span", [words.join(" · ")], { class: "note" }),
      button("Cancel", () => apiJson(`/api/models/download/${encodeURIComponent(entry.id)}`, { method: "DELETE" }).then(showModels)),
    ];
  }
  const start = () => apiJson("/api/models/download", { method: "POST", json: { id: entry.id } }).then(showModels);
  if (entry.partial) {
    return [
      button(`Resume (${gb(entry.received)} of ${gb(entry.bytes)} GB)`, start, { class: "resume" }),
      button("Delete partial download", () => apiJson(`/api/models/partial/${encodeURIComponent(entry.id)}`, { method: "DELETE" }).then(showModels), { class: "delete-partial" }),
    ];
  }
  return [button(`Download (${gb(entry.bytes)} GB)`, start, { class: "download" })];
}

async function showModels() {
  const listing = await apiJson("/api/models");
  const models = listing.local.filter((m) => m.role === "model" || m.role === "");
  const others = listing.local.filter((m) => !(m.role === "model" || m.role === ""));
  const line = (m) => el("li", [`${m.name} · ${m.format} · ${gb(m.bytes)} GB${m.complete ? "" : " · incomplete"}`]);
  $("local").replaceChildren(...models.map(line));
  $("local-other").replaceChildren(...others.map((m) => el("li", [`${m.name} · ${m.role} · ${gb(m.bytes)} GB`])));
  $("catalog").replaceChildren(
    ...listing.catalog.map((entry) =>
      el("li", [
        el("strong", [entry.title]), ` · ${entry.quant} · ${gb(entry.bytes)} GB`,
        el("p", [entry.blurb || entry.note || ""], { class: "note" }),
        el("div", entryActions(entry), { class: "actions" }),
      ], { "data-id": entry.id }),
    ),
  );
}

on("download", (event) => {
  downloads[event.id] = event;
  if (!$("models-view").hidden) showModels().catch(showError);
});

// Hugging Face: text that is not a repository is searched for (HFS-09)
$("hf-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("hf-text").value.trim();
  if (text) lookUp(text).catch(showError);
});

async function lookUp(text) {
  showError(null);
  $("hf-repos").replaceChildren();
  $("hf-models").replaceChildren();
  $("hf-inspect").replaceChildren();
  const response = await api("/api/hf/models", { method: "POST", json: { repo: text } });
  const body = await response.json().catch(() => ({}));
  if (response.ok) return showRepo(body);
  if (body?.error?.code !== "not_a_repo") return showError(new Error(body?.error?.message || response.status));
  const found = await apiJson("/api/hf/search", { method: "POST", json: { query: text } });
  $("hf-repos").replaceChildren(
    ...found.repos.map((repo) =>
      el("li", [
        button(repo.id, async () => showRepo(await apiJson("/api/hf/models", { method: "POST", json: { repo: repo.id } })), { class: "repo" }),
        ` · ${repo.downloads} downloads${repo.gated ? " · needs a token" : ""}`,
      ]),
    ),
  );
}

function showRepo(listing) {
  $("hf-models").replaceChildren(
    ...listing.models.map((model) =>
      el("li", [
        `${model.name} · ${model.quant} · ${gb(model.bytes)} GB · ${model.role}${model.complete ? "" : " · shards missing"} `,
        button("Inspect", () => inspect(listing.repo, model.name), { class: "inspect" }),
      ]),
    ),
  );
}

async function inspect(repo, name) {
  const found = await apiJson("/api/hf/inspect", { method: "POST", json: { repo, name } });
  const add = button("Add to the catalog", async () => {
    await apiJson("/api/hf/add", { method: "POST", json: { repo, name } });
    await showModels();
  }, { class: "add" });
  if (!found.verdict.downloadable) add.disabled = true;
  $("hf-inspect").replaceChildren(
    el("h3", [`${found.repo} · ${found.name}`]),
    el("p", [found.verdict.disk], { class: "disk" }), // the server's sentences, as they are (HFI-26)
    el("p", [found.verdict.memory], { class: "memory" }),
    add,
  );
}

// -- steering: SAEs, attachments and their live values as sliders -----------------

async function showSteering() {
  const [saes, state] = await Promise.all([apiJson("/api/saes"), apiJson("/api/steering")]);
  $("steering-now").textContent = state.steering;
  $("saes").replaceChildren(
    ...saes.data.map((sae) =>
      el("li", [
        `${sae.id} · layer ${sae.layer} · ${sae.d_sae} features `,
        button("Attach", async () => {
          await apiJson("/api/steering/attachments", { method: "POST", json: { sae_id: sae.id } });
          await showSteering();
        }, { class: "attach", "data-sae": sae.id }),
      ]),
    ),
  );
  $("attachments").replaceChildren(...state.attachments.map(attachmentView));
  await Promise.all([showProfiles(), showCircuits(), showProbes()]);
}

function dial(current, range, set) {
  // the persistent dial λ, within the declared range (or the server's [0, 2])
  const [low, high] = range || [0, 2];
  const slider = el("input", [], { type: "range", min: String(low), max: String(high), step: "0.05", class: "dial", "aria-label": "Dial" });
  slider.value = String(current);
  const shown = el("span", [`λ ${current}`], { class: "note" });
  slider.addEventListener("input", () => { shown.textContent = `λ ${slider.value}`; });
  slider.addEventListener("change", () => set(Number(slider.value)).catch(showError));
  return [slider, shown];
}

async function showProfiles() {
  const profiles = await apiJson("/api/profiles");
  $("profiles").replaceChildren(
    ...profiles.data.map((profile) => {
      const name = encodeURIComponent(profile.name);
      const toggle = button(profile.active ? "Deactivate" : "Activate", async () => {
        const change = await apiJson("/api/steering/active-profile", { method: "PUT", json: { name: profile.active ? null : profile.name } });
        $("steering-now").textContent = change.steering;
        await showProfiles();
      }, { class: "activate" });
      return el("li", [
        el("strong", [profile.name]),
        ` · ${profile.sae_id} at layer ${profile.layer} · ${profile.features.length} features `,
        toggle,
        ...dial(profile.intensity, profile.intensity_range, (intensity) =>
          apiJson(`/api/profiles/${name}/dial`, { method: "PUT", json: { intensity } })),
        el("p", [profile.description], { class: "note" }),
      ], { "data-profile": profile.name, "data-active": String(profile.active) });
    }),
  );
}

async function showCircuits() {
  const [circuits, active] = await Promise.all([apiJson("/api/circuits"), apiJson("/api/circuits/active")]);
  // the evidence language a plain request gets now (RUNG-18), as the server words it
  $("circuit-rung").textContent = active.steering ? `Evidence now: rung ${active.steering.rung}, ${active.steering.language}` : "";
  $("circuits").replaceChildren(
    ...circuits.data.map((circuit) => {
      const path = `/api/circuits/${encodeURIComponent(circuit.id)}`;
      const toggle = button(circuit.active ? "Deactivate" : "Activate", async () => {
        const change = await apiJson(`${path}/active`, { method: circuit.active ? "DELETE" : "PUT" });
        $("steering-now").textContent = change.steering;
        await showCircuits();
      }, { class: "activate" });
      const words = circuit.error
        ? [el("span", [circuit.error], { class: "error" })]
        : [
            ` · rung ${circuit.rung}: ${circuit.language} · layers ${circuit.layers.join(", ")}${circuit.live ? "" : " · not steering now"} `,
            toggle,
            ...dial(circuit.intensity, circuit.intensity_range, (intensity) =>
              apiJson(`${path}/dial`, { method: "PUT", json: { intensity } })),
          ];
      return el("li", [el("strong", [circuit.name || circuit.id]), ...words], { "data-circuit": circuit.id, "data-rung": String(circuit.rung) });
    }),
  );
}

async function showProbes() {
  const probes = await apiJson("/api/probes");
  $("probes").replaceChildren(
    ...probes.data.map((probe) => {
      const path = `/api/probes/${encodeURIComponent(probe.name)}`;
      return el("li", [
        el("strong", [probe.name]),
        ` · ${probe.description} · ${probe.armed ? "armed" : "not armed"} `,
        button(probe.armed ? "Disarm" : "Arm", async () => {
          await apiJson(`${path}/${probe.armed ? "disarm" : "arm"}`, { method: "POST", json: {} });
          await showProbes();
        }, { class: "arm" }),
      ], { "data-probe": probe.name, "data-armed": String(probe.armed) });
    }),
  );
}

const pending = {}; // features added in the page, not yet given a strength: by attachment

function attachmentView(attachment) {
  const path = `/api/steering/attachments/${encodeURIComponent(attachment.sae_id)}/${attachment.layer}`;
  const key = `${attachment.sae_id}@${attachment.layer}`;
  const features = attachment.features.map((f) => ({ ...f }));
  for (const index of pending[key] || []) {
    if (!features.some((f) => f.index === index)) features.push({ index, strength: 0 });
  }
  const send = async () => {
    const set = features.filter((f) => f.strength !== 0);
    const change = set.length
      ? await apiJson(`${path}/features`, { method: "PUT", json: { features: set } })
      : await apiJson(`${path}/features`, { method: "DELETE" });
    $("steering-now").textContent = change.steering;
  };
  const rows = features.map((feature) => {
    const slider = el("input", [], { type: "range", min: "-20", max: "20", step: "0.5", class: "strength", "data-index": String(feature.index), "aria-label": `Feature ${feature.index} strength` });
    slider.value = String(feature.strength);
    const shown = el("span", [String(feature.strength)], { class: "note" });
    slider.addEventListener("input", () => { shown.textContent = slider.value; });
    slider.addEventListener("change", () => {
      feature.strength = Number(slider.value);
      send().catch(showError);
    });
    return el("div", [el("label", [`Feature ${feature.index}`]), slider, shown], { class: "param" });
  });
  const index = el("input", [], { type: "number", min: "0", max: String(attachment.d_sae - 1), class: "feature-index", "aria-label": "Feature index" });
  const add = button("Add feature", async () => {
    const value = Number(index.value);
    if (index.value === "" || !Number.isInteger(value) || value < 0 || value >= attachment.d_sae) return;
    (pending[key] ||= []).push(value);
    await showSteering();
  }, { class: "add-feature" });
  return el("fieldset", [
    el("legend", [`${attachment.sae_id} at layer ${attachment.layer}${attachment.live ? "" : " (not steering now)"}`]),
    ...rows,
    el("div", [index, add], { class: "actions" }),
  ], { "data-sae": attachment.sae_id });
}

listModels().catch(showError);
followEvents();
