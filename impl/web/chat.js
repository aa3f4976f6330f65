// The chat view: the conversation, a reply streamed from /v1/chat/completions into its
// turn, and the controls (Send, Enter, Stop, Continue, Regenerate, New chat).

import { api, apiJson, bodyOf, errorOf, sse } from "./api.js";
import { $, showError } from "./dom.js";
import { heatmap } from "./heatmap.js";
import { state } from "./state.js";
import { TurnView } from "./turn.js";

const chat = state.chat;

// The normalized events of one stream chunk, in the order a turn takes them.
function* chunkEvents(chunk) {
  if (chunk.millm?.sae_activations) yield { type: "activations", activations: chunk.millm.sae_activations };
  if (chunk.usage?.prompt_tokens) yield { type: "usage", promptTokens: chunk.usage.prompt_tokens };
  if (chunk.millm_probe_verdicts) yield { type: "verdicts", verdicts: chunk.millm_probe_verdicts };
  if (chunk.millm_steering) yield { type: "steering", steering: chunk.millm_steering };
  const delta = chunk.choices?.[0]?.delta || {};
  if (delta.reasoning_content) yield { type: "reasoning", text: delta.reasoning_content };
  for (const call of delta.tool_calls || []) {
    yield { type: "tool_call", index: call.index, name: call.function?.name || "", arguments: call.function?.arguments || "" };
  }
  if (delta.content) yield { type: "content", text: delta.content };
}

// A streamed chat completion as events {type, ...}: `steering` (the X-miLLM-Steering
// header, then any `millm_steering`), `activations`, `usage`, `verdicts`, `reasoning`,
// `tool_call` and `content`. A refused request throws with the server's message.
export async function* streamChat(body, signal) {
  const response = await api("/v1/chat/completions", { method: "POST", json: body, signal });
  if (!response.ok) throw new Error(errorOf(await bodyOf(response), `${response.status}`));
  const steering = response.headers.get("X-miLLM-Steering");
  if (steering) yield { type: "steering", steering };
  for await (const { data } of sse(response)) {
    if (data === "[DONE]") return;
    yield* chunkEvents(JSON.parse(data));
  }
}

function requestBody() {
  const body = { model: $("model").value || undefined, messages: chat.conversation, stream: true, stream_options: { include_usage: true } };
  if ($("show-activations").checked) {
    body.return_sae_activations = { positions: "all", top_k: 5 }; // the prompt's tokens too
  }
  return body;
}

function setRunning(controller) {
  chat.running = controller;
  $("send").disabled = Boolean(controller);
  $("stop").disabled = !controller;
  const answered = chat.conversation.at(-1)?.role === "assistant";
  $("regenerate").disabled = Boolean(controller) || !answered;
  $("continue").disabled = Boolean(controller) || !answered;
}

// The heatmap under a turn, its tokens' text from POST /api/detokenize.
async function showActivations(view) {
  if (!view.activations?.positions.length) return;
  const tokens = view.activations.positions.map((p) => p.token_id);
  const { pieces } = await apiJson("/api/detokenize", { method: "POST", json: { tokens } });
  view.node.append(heatmap(view.activations, pieces, view.promptTokens));
}

// `continuing`: the last assistant message goes as a partial answer to continue (a
// trailing assistant message, OAI-CONT-01), and the reply extends its turn.
async function reply(continuing = false) {
  const view = continuing && chat.lastView ? chat.lastView : new TurnView("assistant");
  chat.lastView = view;
  const controller = new AbortController();
  setRunning(controller);
  view.start(continuing ? chat.conversation.at(-1).content : "");
  try {
    for await (const event of streamChat(requestBody(), controller.signal)) view.take(event);
    view.finish();
    await showActivations(view);
  } catch (error) {
    if (error.name !== "AbortError") showError(error);
  } finally {
    if (continuing) chat.conversation.at(-1).content = view.content;
    else chat.conversation.push({ role: "assistant", content: view.content });
    setRunning(null);
  }
}

export function send(event) {
  event.preventDefault();
  const text = $("prompt").value.trim();
  if (!text || chat.running) return;
  $("prompt").value = "";
  showError(null);
  const message = { role: "user", content: text };
  chat.conversation.push(message);
  TurnView.of(message);
  reply();
}

// Enter sends; Shift+Enter is a new line; Enter that ends an input method's composition
// only ends it (keyCode 229: the key event some browsers send for it).
export function enterSends(event) {
  if (event.key !== "Enter" || event.shiftKey || event.isComposing || event.keyCode === 229) return;
  event.preventDefault();
  $("ask").requestSubmit();
}

export function stop() {
  chat.running?.abort();
}

export function continueReply() {
  if (chat.running || chat.conversation.at(-1)?.role !== "assistant") return;
  showError(null);
  reply(true);
}

export function regenerate() {
  if (chat.running || chat.conversation.at(-1)?.role !== "assistant") return;
  chat.conversation.pop();
  $("chat").lastElementChild?.remove();
  reply();
}

export function clear() {
  chat.running?.abort();
  chat.conversation.length = 0;
  chat.lastView = null;
  $("chat").replaceChildren();
  setRunning(null);
}
