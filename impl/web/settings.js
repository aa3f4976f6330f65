// The settings view: the parameters from /api/params and /api/config (PARAMS-22/23), and
// the plan for this machine (PLAN-23/24; EVENTS-25: the step's label is shown, the step
// is protocol).

import { apiJson } from "./api.js";
import { $, el, showError } from "./dom.js";
import { state } from "./state.js";

function special(param, value) {
  return (param.special || []).find((s) => String(s.value) === String(value));
}

function describe(param, value) {
  const words = [];
  const named = special(param, value);
  if (named) words.push(named.label); // a special value's label in place of its number
  if (param.typical) words.push(`typical ${param.typical.min}–${param.typical.max}${param.unit ? " " + param.unit : ""}`);
  if (param.scope === "session") words.push("applies at the next load");
  return words.join(" · ");
}

function field(param, value) {
  if (param.type === "bool") {
    const box = el("input", [], { type: "checkbox" });
    box.checked = Boolean(value);
    return box;
  }
  if (param.type === "choice") {
    const select = el("select", (param.choices || []).map((c) => el("option", [c.label], { value: String(c.value) })));
    select.value = String(value);
    return select;
  }
  const numeric = param.type === "int" || param.type === "float";
  const text = el("input", [], { type: numeric && !param.accepts_auto ? "number" : "text" });
  if (numeric && param.min !== undefined) text.min = param.min;
  if (numeric && param.max !== undefined) text.max = param.max;
  if (param.type === "float") text.step = "any";
  text.value = value === null || value === undefined ? "" : String(value);
  return text;
}

function input(param, value) {
  const node = field(param, value);
  node.id = `param-${param.key}`;
  node.dataset.key = param.key;
  node.addEventListener("change", () => setParam(param, node).catch(showError));
  return node;
}

function parsed(param, node) {
  if (param.type === "bool") return node.checked;
  if (param.type === "int" || param.type === "float") {
    if (param.accepts_auto && node.value.trim() === "auto") return "auto";
    const number = Number(node.value);
    return node.value.trim() === "" || Number.isNaN(number) ? node.value : number;
  }
  return node.value;
}

async function setParam(param, node) {
  const change = await apiJson("/api/config", { method: "PUT", json: { values: { [param.key]: parsed(param, node) } } });
  const rejected = Object.entries(change.rejected || {});
  $("rejected").hidden = rejected.length === 0;
  $("rejected").textContent = rejected.map(([key, why]) => `${key}: ${why}`).join("; ");
  showConfig(change);
}

// The notes of a config (also the `config` event's): what each value means now.
export function showConfig(config) {
  $("reload").hidden = !config.reload_required;
  for (const param of state.settings.table || []) {
    const note = $(`note-${param.key}`);
    if (note) note.textContent = describe(param, config.values[param.key]);
  }
}

function row(param, value) {
  return el("div", [
    el("label", [param.label], { for: `param-${param.key}`, title: param.help }),
    input(param, value),
    el("span", [describe(param, value)], { id: `note-${param.key}`, class: "note" }),
  ], { class: "param" });
}

export async function show() {
  const [params, config] = await Promise.all([apiJson("/api/params"), apiJson("/api/config")]);
  state.settings.table = params;
  const all = $("show-all").checked;
  const groups = new Map();
  for (const param of params) {
    if (!all && (param.level === "experimental" || param.level === "debug")) continue;
    if (!groups.has(param.group_label)) groups.set(param.group_label, []);
    groups.get(param.group_label).push(row(param, config.values[param.key]));
  }
  $("params").replaceChildren(...[...groups].map(([label, rows]) => el("fieldset", [el("legend", [label]), ...rows])));
  showConfig(config);
}

// -- the plan ---------------------------------------------------------------------------

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

export async function makePlan() {
  try {
    $("plan-make").disabled = true;
    showPlan(await apiJson("/api/plan?measure=1"));
  } catch (error) {
    showError(error);
  } finally {
    $("plan-make").disabled = false;
    $("plan-progress").textContent = "";
  }
}

export async function applyPlan() {
  try {
    showConfig(await apiJson("/api/plan/apply", { method: "POST", json: {} }));
    await show();
  } catch (error) {
    showError(error);
  }
}

export function onPlanProgress(progress) {
  $("plan-progress").textContent = progress.label || "";
}
