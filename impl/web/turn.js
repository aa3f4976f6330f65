// One turn of the conversation on the page. An assistant turn is painted from the
// normalized events of chat.js's streamChat: the reply's text as Markdown (at most once
// a frame), its reasoning apart, its tool calls as calls, probe verdicts, the steering
// statement.

import { $, el } from "./dom.js";
import { render } from "./markdown.js";

function steeringNote(steering) {
  return el("span", [`Steering: ${steering}`], { class: "steering" });
}

function verdictList(verdicts) {
  const items = verdicts.map((v) =>
    el("li", [`${v.probe}: ${v.verdict} (${v.outcome}) — ${v.reason}`], { "data-outcome": v.outcome }));
  return el("ul", items, { class: "verdicts" });
}

function callView(call) {
  return el("div", [el("code", [`${call.name}(${call.arguments})`])], { class: "tool-call" });
}

export class TurnView {
  constructor(role) {
    this.body = el("div", [], { class: "body" });
    this.reasoningBox = el("details", [el("summary", ["Reasoning"])], { class: "reasoning", hidden: "" });
    this.calls = el("div", [], { class: "calls" });
    this.meta = el("div", [], { class: "meta" });
    this.node = el("article", [this.reasoningBox, this.body, this.calls, this.meta], { class: `turn ${role}` });
    $("chat").append(this.node);
  }

  // A message as it stands: the user's as text, the assistant's as Markdown.
  static of(message) {
    const view = new TurnView(message.role);
    view.body.append(message.role === "assistant" ? render(message.content || "") : message.content);
    return view;
  }

  // Ready for a reply whose text starts as `content` (a continued reply's text so far).
  start(content) {
    this.content = content;
    this.reasoning = "";
    this.toolCalls = {};
    this.activations = null;
    this.promptTokens = 0;
    this.painting = false;
    this.calls.replaceChildren();
  }

  take(event) {
    TAKE[event.type](this, event);
  }

  addContent(text) {
    this.content += text;
    if (this.painting) return; // once a frame at most: a long reply is not parsed again for every token
    this.painting = true;
    requestAnimationFrame(() => {
      this.painting = false;
      this.body.replaceChildren(render(this.content));
    });
  }

  addReasoning(text) {
    this.reasoning += text;
    this.reasoningBox.hidden = false;
    this.reasoningBox.replaceChildren(el("summary", ["Reasoning"]), el("div", [this.reasoning]));
  }

  addCall({ index, name, arguments: args }) {
    const held = (this.toolCalls[index] ||= { name: "", arguments: "" });
    held.name += name;
    held.arguments += args;
    this.calls.replaceChildren(...Object.values(this.toolCalls).map(callView));
  }

  // The whole reply, whatever frame is pending.
  finish() {
    this.body.replaceChildren(render(this.content));
  }
}

const TAKE = {
  steering: (view, e) => view.meta.replaceChildren(steeringNote(e.steering)),
  verdicts: (view, e) => view.calls.after(verdictList(e.verdicts)),
  activations: (view, e) => { view.activations = e.activations; },
  usage: (view, e) => { view.promptTokens = e.promptTokens; },
  reasoning: (view, e) => view.addReasoning(e.text),
  tool_call: (view, e) => view.addCall(e),
  content: (view, e) => view.addContent(e.text),
};
