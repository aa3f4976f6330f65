// The steering view: SAEs, attachments and their features as sliders, profiles and
// clusters with their dial, circuits (their evidence rung, RUNG-18) and probes.

import { apiJson } from "./api.js";
import { $, button, el, showError } from "./dom.js";
import { state } from "./state.js";

// What a request without steering fields gets now, from a change's answer.
function steeringNow(change) {
  $("steering-now").textContent = change.steering;
}

// The persistent dial λ, within the declared range (or the server's [0, 2]).
function dial(current, range, set) {
  const [low, high] = range || [0, 2];
  const slider = el("input", [], { type: "range", min: String(low), max: String(high), step: "0.05", class: "dial", "aria-label": "Dial" });
  slider.value = String(current);
  const shown = el("span", [`λ ${current}`], { class: "note" });
  slider.addEventListener("input", () => { shown.textContent = `λ ${slider.value}`; });
  slider.addEventListener("change", () => set(Number(slider.value)).catch(showError));
  return [slider, shown];
}

function saeItem(sae) {
  const attach = button("Attach", async () => {
    await apiJson("/api/steering/attachments", { method: "POST", json: { sae_id: sae.id } });
    await show();
  }, { class: "attach", "data-sae": sae.id });
  return el("li", [`${sae.id} · layer ${sae.layer} · ${sae.d_sae} features `, attach]);
}

export async function show() {
  const [saes, now] = await Promise.all([apiJson("/api/saes"), apiJson("/api/steering")]);
  steeringNow(now);
  $("saes").replaceChildren(...saes.data.map(saeItem));
  $("attachments").replaceChildren(...now.attachments.map(attachmentView));
  await Promise.all([showProfiles(), showCircuits(), showProbes()]);
}

// -- attachments: one slider a feature, and features added by index ------------------

function featureRow(feature, send) {
  const slider = el("input", [], { type: "range", min: "-20", max: "20", step: "0.5", class: "strength", "data-index": String(feature.index), "aria-label": `Feature ${feature.index} strength` });
  slider.value = String(feature.strength);
  const shown = el("span", [String(feature.strength)], { class: "note" });
  slider.addEventListener("input", () => { shown.textContent = slider.value; });
  slider.addEventListener("change", () => {
    feature.strength = Number(slider.value);
    send().catch(showError);
  });
  return el("div", [el("label", [`Feature ${feature.index}`]), slider, shown], { class: "param" });
}

// The index box and its button: the feature is shown, at strength 0, until it has one.
function addFeature(attachment, key) {
  const index = el("input", [], { type: "number", min: "0", max: String(attachment.d_sae - 1), class: "feature-index", "aria-label": "Feature index" });
  const add = button("Add feature", async () => {
    const value = Number(index.value);
    if (index.value === "" || !Number.isInteger(value) || value < 0 || value >= attachment.d_sae) return;
    (state.steering.pending[key] ||= []).push(value);
    await show();
  }, { class: "add-feature" });
  return el("div", [index, add], { class: "actions" });
}

function attachmentView(attachment) {
  const path = `/api/steering/attachments/${encodeURIComponent(attachment.sae_id)}/${attachment.layer}`;
  const key = `${attachment.sae_id}@${attachment.layer}`;
  const features = attachment.features.map((f) => ({ ...f }));
  for (const index of state.steering.pending[key] || []) {
    if (!features.some((f) => f.index === index)) features.push({ index, strength: 0 });
  }
  const send = async () => {
    const set = features.filter((f) => f.strength !== 0);
    steeringNow(set.length
      ? await apiJson(`${path}/features`, { method: "PUT", json: { features: set } })
      : await apiJson(`${path}/features`, { method: "DELETE" }));
  };
  return el("fieldset", [
    el("legend", [`${attachment.sae_id} at layer ${attachment.layer}${attachment.live ? "" : " (not steering now)"}`]),
    ...features.map((feature) => featureRow(feature, send)),
    addFeature(attachment, key),
  ], { "data-sae": attachment.sae_id });
}

// -- profiles, circuits, probes ---------------------------------------------------------

function profileItem(profile) {
  const name = encodeURIComponent(profile.name);
  const toggle = button(profile.active ? "Deactivate" : "Activate", async () => {
    steeringNow(await apiJson("/api/steering/active-profile", { method: "PUT", json: { name: profile.active ? null : profile.name } }));
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
}

async function showProfiles() {
  const profiles = await apiJson("/api/profiles");
  $("profiles").replaceChildren(...profiles.data.map(profileItem));
}

function circuitItem(circuit) {
  const path = `/api/circuits/${encodeURIComponent(circuit.id)}`;
  const toggle = button(circuit.active ? "Deactivate" : "Activate", async () => {
    steeringNow(await apiJson(`${path}/active`, { method: circuit.active ? "DELETE" : "PUT" }));
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
}

async function showCircuits() {
  const [circuits, active] = await Promise.all([apiJson("/api/circuits"), apiJson("/api/circuits/active")]);
  // the evidence language a plain request gets now (RUNG-18), as the server words it
  $("circuit-rung").textContent = active.steering ? `Evidence now: rung ${active.steering.rung}, ${active.steering.language}` : "";
  $("circuits").replaceChildren(...circuits.data.map(circuitItem));
}

function probeItem(probe) {
  const path = `/api/probes/${encodeURIComponent(probe.name)}`;
  const arm = button(probe.armed ? "Disarm" : "Arm", async () => {
    await apiJson(`${path}/${probe.armed ? "disarm" : "arm"}`, { method: "POST", json: {} });
    await showProbes();
  }, { class: "arm" });
  return el("li", [el("strong", [probe.name]), ` · ${probe.description} · ${probe.armed ? "armed" : "not armed"} `, arm], {
    "data-probe": probe.name, "data-armed": String(probe.armed),
  });
}

async function showProbes() {
  const probes = await apiJson("/api/probes");
  $("probes").replaceChildren(...probes.data.map(probeItem));
}
