// The miserver web UI: ES modules, no build step, only the documented HTTP API
// (REQ-003 GEN-02/03, SEC-09..11, SEC-28..35, SEC-40, SECN-08). Model output is never
// parsed as HTML: markdown.js builds DOM nodes from a whitelist, and every piece of
// model text lands in a text node.
//
// This module is the wiring: every listener on the page's own elements and on
// /api/events is registered here, and nothing else runs when a module loads. The
// modules, by view: api.js (the API, the key, events), dom.js, markdown.js, chat.js
// (with turn.js and heatmap.js), header.js, models.js and batches.js, steering.js,
// settings.js; the one mutable state is state.js's.

import { followEvents, keyEntered, on } from "./api.js";
import * as batches from "./batches.js";
import * as chat from "./chat.js";
import { $, showError } from "./dom.js";
import * as header from "./header.js";
import * as models from "./models.js";
import * as settings from "./settings.js";
import * as steering from "./steering.js";

// What each view fetches when it is shown; the chat view keeps what it has.
const VIEWS = {
  "models-view": () => Promise.all([models.show(), batches.show()]),
  "steering-view": steering.show,
  "settings-view": settings.show,
};

function showView(chosen) {
  for (const other of document.querySelectorAll("nav.views button")) {
    other.setAttribute("aria-pressed", String(other === chosen));
    $(other.dataset.view).hidden = other !== chosen;
  }
  VIEWS[chosen.dataset.view]?.().catch(showError);
}

function listen(id, type, handler) {
  $(id).addEventListener(type, handler);
}

listen("key-form", "submit", keyEntered);

listen("ask", "submit", chat.send);
listen("prompt", "keydown", chat.enterSends);
listen("stop", "click", chat.stop);
listen("continue", "click", chat.continueReply);
listen("regenerate", "click", chat.regenerate);
listen("clear", "click", chat.clear);

listen("load", "click", header.load);
listen("unload", "click", header.unload);
for (const view of document.querySelectorAll("nav.views button")) {
  view.addEventListener("click", () => showView(view));
}

listen("hf-form", "submit", models.lookUpForm);
listen("show-all", "change", () => settings.show().catch(showError));
listen("plan-make", "click", settings.makePlan);
listen("plan-apply", "click", settings.applyPlan);

on("state", header.onState);
on("done", header.onDone);
on("token", header.onToken);
on("config", settings.showConfig);
on("plan_progress", settings.onPlanProgress);
on("download", models.onDownload);
on("batch_job", batches.onBatchJob);

header.listModels().catch(showError);
followEvents();
