// The header bar: the model picker, Load and Unload, the session's state, and the rate,
// memory, CPU and flash figures from /api/events.

import { apiJson } from "./api.js";
import { $, el, showError } from "./dom.js";
import { state } from "./state.js";

const STATES = { ready: "Ready", loading: "Loading…", planning: "Planning…", error: "Error", empty: "No model" };

// Nothing about streaming before a model has loaded (INFO-21); once one has, say it runs
// plainly when it does not stream (INFO-20).
function engineWords(model) {
  if (!model) return "";
  if (model.streaming) return `${model.engine}, streaming experts`;
  if (model.engine === "llama.cpp") return "plain llama.cpp (mmap), no expert streaming";
  return `plain ${model.engine}, no expert streaming`;
}

function showState(info) {
  $("state").textContent = STATES[info.state] || info.state;
  $("state").dataset.state = info.state;
  const model = info.state === "ready" ? info.model : null;
  state.header.threads = model?.busy_threads || model?.compute_threads || 1;
  $("engine").textContent = engineWords(model);
  if (info.error) showError(info.error);
}

export async function listModels() {
  const [models, info] = await Promise.all([apiJson("/v1/models"), apiJson("/api/info")]);
  const current = info.model?.id;
  $("model").replaceChildren(
    ...models.data.map((m) => el("option", [m.id], m.id === current ? { value: m.id, selected: "" } : { value: m.id })),
  );
  showState(info);
}

export async function load() {
  try {
    showError(null);
    await apiJson("/api/session/load", { method: "POST", json: { model: $("model").value } });
  } catch (error) {
    showError(error);
  }
}

export async function unload() {
  try {
    await apiJson("/api/session/unload", { method: "POST", json: {} });
  } catch (error) {
    showError(error);
  }
}

// -- /api/events ----------------------------------------------------------------------

export function onState(info) {
  showState(info);
  if (info.model?.id) $("model").value = info.model.id;
}

export function onDone(done) {
  if (done.tok_s) $("rate").textContent = `${done.tok_s.toFixed(1)} tokens/s`;
  $("flash").textContent = done.flash_wait_s_tok > 0 ? `flash ${Math.round(done.flash_wait_s_tok * 1000)} ms a token` : "";
}

export function onToken(token) {
  if (token.rss_mib) $("memory").textContent = `${Math.round(token.rss_mib)} MiB`;
  if (token.wall_ms > 0) $("cpu").textContent = `CPU ${Math.round((100 * token.cpu_ms) / (token.wall_ms * state.header.threads))}%`;
  // "flash" from flash_wait_* alone, whatever the session's mode (EVENTS-30)
  $("flash").textContent = token.flash_wait_ms > 0 ? `flash ${Math.round(token.flash_wait_ms)} ms` : "";
}
