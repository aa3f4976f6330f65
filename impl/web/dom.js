// Building the page: elements from a tag, children and attributes, never from HTML.

export const $ = (id) => document.getElementById(id);

// `children`: nodes or strings; a string becomes a text node, never markup.
export function el(tag, children = [], attributes = {}) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  for (const child of children) node.append(child);
  return node;
}

export function showError(error) {
  const box = $("error");
  box.textContent = error ? String(error.message || error) : "";
  box.hidden = !error;
}

// A button whose `action` is async; its failure is shown, not thrown.
export function button(label, action, attributes = {}) {
  const node = el("button", [label], { type: "button", ...attributes });
  node.addEventListener("click", () => action().catch(showError));
  return node;
}
