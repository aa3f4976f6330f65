// The models view: on disk, the catalog and its downloads, Hugging Face
// (MODELS-27/38/39, HFS-09, HFI-26).

import { api, apiJson, bodyOf, errorOf } from "./api.js";
import { $, button, el, showError } from "./dom.js";
import { state } from "./state.js";

const gb = (bytes) => (bytes / 1e9).toFixed(bytes < 10e9 ? 2 : 1); // decimal GB
const entryPath = (what, entry) => `/api/models/${what}/${encodeURIComponent(entry.id)}`;

function progress(entry, live) {
  const received = live?.received ?? entry.received;
  const words = [`${gb(received)} of ${gb(entry.bytes)} GB`];
  if (live?.bytes_per_s) words.push(`${(live.bytes_per_s / 1e6).toFixed(1)} MB/s`);
  if (live?.retry_in_s) words.push(`retrying in ${live.retry_in_s} s`);
  return [
    el("progress", [], { max: String(entry.bytes), value: String(received) }),
    el("span", [words.join(" · ")], { class: "note" }),
    button("Cancel", () => apiJson(entryPath("download", entry), { method: "DELETE" }).then(show)),
  ];
}

function entryActions(entry) {
  const live = state.models.downloads[entry.id];
  if (entry.status === "on_disk") return [el("span", ["On disk"], { class: "note" })];
  if (entry.status === "downloading" || live?.state === "running" || live?.state === "retrying") {
    return progress(entry, live);
  }
  const start = () => apiJson("/api/models/download", { method: "POST", json: { id: entry.id } }).then(show);
  if (entry.partial) {
    const remove = () => apiJson(entryPath("partial", entry), { method: "DELETE" }).then(show);
    return [
      button(`Resume (${gb(entry.received)} of ${gb(entry.bytes)} GB)`, start, { class: "resume" }),
      button("Delete partial download", remove, { class: "delete-partial" }),
    ];
  }
  return [button(`Download (${gb(entry.bytes)} GB)`, start, { class: "download" })];
}

function catalogEntry(entry) {
  return el("li", [
    el("strong", [entry.title]), ` · ${entry.quant} · ${gb(entry.bytes)} GB`,
    el("p", [entry.blurb || entry.note || ""], { class: "note" }),
    el("div", entryActions(entry), { class: "actions" }),
  ], { "data-id": entry.id });
}

export async function show() {
  const listing = await apiJson("/api/models");
  const isModel = (m) => m.role === "model" || m.role === "";
  const line = (m) => el("li", [`${m.name} · ${m.format} · ${gb(m.bytes)} GB${m.complete ? "" : " · incomplete"}`]);
  $("local").replaceChildren(...listing.local.filter(isModel).map(line));
  $("local-other").replaceChildren(
    ...listing.local.filter((m) => !isModel(m)).map((m) => el("li", [`${m.name} · ${m.role} · ${gb(m.bytes)} GB`])),
  );
  $("catalog").replaceChildren(...listing.catalog.map(catalogEntry));
}

export function onDownload(event) {
  state.models.downloads[event.id] = event;
  if (!$("models-view").hidden) show().catch(showError);
}

// -- Hugging Face: text that is not a repository is searched for (HFS-09) -------------

const listRepo = (repo) => apiJson("/api/hf/models", { method: "POST", json: { repo } });

async function inspect(repo, name) {
  const found = await apiJson("/api/hf/inspect", { method: "POST", json: { repo, name } });
  const add = button("Add to the catalog", async () => {
    await apiJson("/api/hf/add", { method: "POST", json: { repo, name } });
    await show();
  }, { class: "add" });
  if (!found.verdict.downloadable) add.disabled = true;
  $("hf-inspect").replaceChildren(
    el("h3", [`${found.repo} · ${found.name}`]),
    el("p", [found.verdict.disk], { class: "disk" }), // the server's sentences, as they are (HFI-26)
    el("p", [found.verdict.memory], { class: "memory" }),
    add,
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

async function search(text) {
  const found = await apiJson("/api/hf/search", { method: "POST", json: { query: text } });
  $("hf-repos").replaceChildren(
    ...found.repos.map((repo) =>
      el("li", [
        button(repo.id, async () => showRepo(await listRepo(repo.id)), { class: "repo" }),
        ` · ${repo.downloads} downloads${repo.gated ? " · needs a token" : ""}`,
      ]),
    ),
  );
}

async function lookUp(text) {
  showError(null);
  $("hf-repos").replaceChildren();
  $("hf-models").replaceChildren();
  $("hf-inspect").replaceChildren();
  const response = await api("/api/hf/models", { method: "POST", json: { repo: text } });
  const body = await bodyOf(response);
  if (response.ok) return showRepo(body);
  if (body?.error?.code !== "not_a_repo") return showError(new Error(errorOf(body, response.status)));
  return search(text);
}

export function lookUpForm(event) {
  event.preventDefault();
  const text = $("hf-text").value.trim();
  if (text) lookUp(text).catch(showError);
}
