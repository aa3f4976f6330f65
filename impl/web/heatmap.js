// The activation heatmap: a reply's tokens coloured by a chosen feature (OAI-ACT-12).
//
// `pieces`: each position's token text (POST /api/detokenize); positions before
// `promptTokens` are the prompt's. The features are offered by their weight on the
// reply (the sum of their values over its tokens), the heaviest first. The shades
// are scaled to the chosen feature's largest value past the first token: models
// pile activation on the first position (an attention sink), which would otherwise
// leave every other token unshaded; the first token is shaded at most 5.

import { el } from "./dom.js";

function byWeight(positions, promptTokens) {
  const weight = new Map();
  for (const p of positions) {
    for (const f of p.features) {
      const onReply = p.position >= promptTokens ? Math.abs(f.value) : 0;
      weight.set(f.index, (weight.get(f.index) || 0) + onReply);
    }
  }
  return [...weight.keys()].sort((a, b) => weight.get(b) - weight.get(a) || a - b);
}

// The value that gets the darkest shade: the largest past the first token.
function darkest(positions, values) {
  const past = values.filter((_, i) => positions[i].position > 0).map(Math.abs);
  return Math.max(...(past.some((v) => v > 0) ? past : values.map(Math.abs)), 1e-9);
}

function token(p, piece, value, top, promptTokens) {
  return el("span", [piece], {
    class: p.position < promptTokens ? "token prompt" : "token",
    "data-value": value.toFixed(3),
    "data-level": String(Math.min(5, Math.round((Math.abs(value) / top) * 5))), // 0..5: the stylesheet's shades
    title: p.features.map((f) => `feature ${f.index}: ${f.value.toFixed(3)}`).join("\n"),
  });
}

export function heatmap(activations, pieces, promptTokens) {
  const positions = activations.positions;
  const features = byWeight(positions, promptTokens);
  const chosen = el("select", features.map((f) => el("option", [`feature ${f}`], { value: String(f) })), { class: "feature" });
  const scale = el("span", [], { class: "note scale" });
  const row = el("div", [], { class: "tokens" });
  const paint = () => {
    const index = Number(chosen.value);
    const values = positions.map((p) => p.features.find((f) => f.index === index)?.value || 0);
    const top = darkest(positions, values);
    scale.textContent = ` darkest at ${top.toFixed(2)} and above`;
    row.replaceChildren(...positions.map((p, i) => token(p, pieces[i], values[i], top, promptTokens)));
  };
  chosen.addEventListener("change", paint);
  paint();
  const meta = el("div", [`SAE ${activations.sae_id} at layer ${activations.layer}: `, chosen, scale], { class: "meta" });
  return el("div", [meta, row], { class: "heatmap" });
}
