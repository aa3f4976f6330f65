// The models view's batch jobs: the Batch API's batches (/v1/batches, issue 50), newest
// first, each with its progress as its `batch_job` events come, and Cancel while it runs.

import { apiJson } from "./api.js";
import { $, button, el } from "./dom.js";
import { state } from "./state.js";

function line(batch) {
  const counts = batch.request_counts;
  const done = counts.completed + counts.failed;
  const parts = [
    el("strong", [batch.id]), ` · ${batch.endpoint} · `,
    el("span", [batch.status], { class: "status" }),
    el("progress", [], { max: String(Math.max(counts.total, 1)), value: String(done) }),
    el("span", [`${done} of ${counts.total} lines · ${counts.failed} failed`], { class: "note" }),
  ];
  if (batch.status === "in_progress") {
    const cancel = () => apiJson(`/v1/batches/${encodeURIComponent(batch.id)}/cancel`, { method: "POST" });
    parts.push(button("Cancel", () => cancel().then(onBatchJob), { class: "cancel-batch" }));
  }
  return el("li", parts, { "data-id": batch.id, "data-status": batch.status });
}

function render() {
  const newest = Object.values(state.batches.byId).sort((a, b) => b.created_at - a.created_at);
  $("batches").replaceChildren(...newest.map(line));
}

export async function show() {
  const page = await apiJson("/v1/batches?limit=100");
  state.batches.byId = Object.fromEntries(page.data.map((batch) => [batch.id, batch]));
  render();
}

export function onBatchJob(batch) {
  state.batches.byId[batch.id] = batch;
  if (!$("models-view").hidden) render();
}
