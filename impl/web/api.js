// The documented HTTP API, with the key (SEC-09..11), and its event stream.

import { $ } from "./dom.js";
import { state } from "./state.js";

const KEY_STORE = "miserver.key";

// The message of an error body (the one error shape), or `fallback`.
export const errorOf = (body, fallback) => body?.error?.message || fallback;

// A response's JSON body, or {} when it has none.
export const bodyOf = (response) => response.json().catch(() => ({}));

function keyHeaders(extra = {}) {
  const key = localStorage.getItem(KEY_STORE);
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

function askForKey(why) {
  if (!state.keyWaiters) {
    state.keyWaiters = [];
    $("key-why").textContent = why;
    $("key").value = "";
    $("key-dialog").showModal();
  }
  return new Promise((resolve) => state.keyWaiters.push(resolve));
}

// The key dialog's submit: keep the key in the browser (SEC-10) and retry what waited.
export function keyEntered() {
  localStorage.setItem(KEY_STORE, $("key").value.trim());
  const waiting = state.keyWaiters || [];
  state.keyWaiters = null;
  waiting.forEach((resolve) => resolve());
}

// `options.json`: a body to send as JSON. Every method but GET and HEAD is sent as JSON.
export async function api(path, options = {}) {
  const sent = localStorage.getItem(KEY_STORE);
  const init = { ...options, headers: keyHeaders(options.headers || {}) };
  if (init.json !== undefined) init.body = JSON.stringify(init.json);
  delete init.json;
  const method = (init.method || "GET").toUpperCase();
  if (method !== "GET" && method !== "HEAD") init.headers["Content-Type"] = "application/json";
  const response = await fetch(path, init);
  if (response.status === 401) {
    const body = await bodyOf(response);
    // a 401 to a request sent before the key was entered retries with that key, rather
    // than asking again over a page that has its key
    if (localStorage.getItem(KEY_STORE) === sent) {
      await askForKey(errorOf(body, "This server needs its API key."));
    }
    return api(path, options);
  }
  return response;
}

// The JSON body of a successful answer; a failure throws with the server's message.
export async function apiJson(path, options = {}) {
  const response = await api(path, options);
  const body = await bodyOf(response);
  if (!response.ok) throw new Error(errorOf(body, `${response.status} ${path}`));
  return body;
}

// -- server-sent events over fetch (the key rides along: SEC-11) -------------------

function parseEvent(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
  }
  return data.length ? { event, data: data.join("\n") } : null;
}

// The events of a text/event-stream response, as {event, data}.
export async function* sse(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const parsed = parseEvent(buffer.slice(0, cut));
      buffer = buffer.slice(cut + 2);
      if (parsed) yield parsed;
    }
  }
}

// Call `handler` with the parsed data of each /api/events event named `event`.
export function on(event, handler) {
  (state.listeners[event] ||= []).push(handler);
}

// Read /api/events for good: when the stream ends or fails, again after a wait that
// doubles up to 10 s (back to 0.5 s once a stream opens).
export async function followEvents() {
  for (let wait = 500; ; wait = Math.min(wait * 2, 10000)) {
    try {
      const response = await api("/api/events");
      if (response.ok) {
        wait = 500;
        for await (const { event, data } of sse(response)) {
          const parsed = JSON.parse(data);
          (state.listeners[event] || []).forEach((handler) => handler(parsed));
        }
      }
    } catch (error) {
      // the stream ended or the server went away: try again after a wait
    }
    await new Promise((resolve) => setTimeout(resolve, wait));
  }
}
