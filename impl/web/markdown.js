// Safe Markdown (SEC-28..35, SECN-08): a string in, a DocumentFragment out. Model output
// is never parsed as HTML: the fragment is built from a whitelist of elements, every
// piece of text lands in a text node, and anything else, raw HTML included, is text.

import { el } from "./dom.js";

const IMAGE_TYPES = /^data:image\/(png|gif|jpeg|webp);base64,[A-Za-z0-9+/=\s]*$/i;
const LINK_SCHEMES = new Set(["http:", "https:", "mailto:"]);

function safeLink(url) {
  try {
    const parsed = new URL(url);
    return LINK_SCHEMES.has(parsed.protocol) ? parsed.href : null;
  } catch {
    return null;
  }
}

function image(alt, url) {
  if (IMAGE_TYPES.test(url)) return el("img", [], { src: url.replace(/\s/g, ""), alt });
  return el("span", [alt], { class: "alt" }); // any other image: its alt text (SEC-32)
}

function link(children, url) {
  const href = safeLink(url);
  if (!href) return el("span", children);
  return el("a", children, { href, target: "_blank", rel: "noopener noreferrer", referrerpolicy: "no-referrer" });
}

// Inline Markdown: code spans, images, links, autolinks, strong, emphasis, breaks.
const INLINE = [
  [/^`([^`]+)`/, (m) => el("code", [m[1]])],
  [/^!\[([^\]]*)\]\(([^)\s]*)[^)]*\)/, (m) => image(m[1], m[2])],
  [/^\[([^\]]+)\]\(([^)\s]*)[^)]*\)/, (m) => link(inline(m[1]), m[2])],
  [/^<((?:https?|mailto):[^>\s]+)>/, (m) => link([m[1]], m[1])],
  [/^(\*\*|__)(?=\S)([\s\S]*?\S)\1/, (m) => el("strong", inline(m[2]))],
  [/^(\*|_)(?=\S)([\s\S]*?\S)\1/, (m) => el("em", inline(m[2]))],
  [/^ {2,}\n|^\\\n/, () => el("br")],
];

// The first inline form `text` starts with, as [its match, its node], or null.
function inlineAt(text) {
  for (const [pattern, make] of INLINE) {
    const m = pattern.exec(text);
    if (m) return [m, make(m)];
  }
  return null;
}

function inline(text) {
  const out = [];
  let plain = "";
  while (text) {
    const found = inlineAt(text);
    if (!found) {
      plain += text[0];
      text = text.slice(1);
      continue;
    }
    if (plain) out.push(plain);
    plain = "";
    out.push(found[1]);
    text = text.slice(found[0][0].length);
  }
  if (plain) out.push(plain);
  return out;
}

// Block Markdown: fenced code, headings, rules, quotes, lists; the rest is paragraphs.
// Each reader looks at lines[i]: when a block of its kind starts there it returns
// {node, next}, `next` the index of the line after the block (always past i);
// otherwise null.

function fenced(lines, i) {
  const m = /^\s*(```|~~~)\s*([\w+-]*)/.exec(lines[i]);
  if (!m) return null;
  const body = [];
  let next = i + 1;
  for (; next < lines.length && !lines[next].trimStart().startsWith(m[1]); next += 1) body.push(lines[next]);
  const code = el("code", [body.join("\n")]);
  if (m[2]) code.dataset.lang = m[2];
  return { node: el("pre", [code]), next: next + 1 };
}

function heading(lines, i) {
  const m = /^(#{1,6})\s+(.*)$/.exec(lines[i]);
  if (!m) return null;
  return { node: el(`h${m[1].length}`, inline(m[2].replace(/\s#+\s*$/, ""))), next: i + 1 };
}

function rule(lines, i) {
  return /^\s*([-*_])(\s*\1){2,}\s*$/.test(lines[i]) ? { node: el("hr"), next: i + 1 } : null;
}

function quote(lines, i) {
  if (!/^\s*>/.test(lines[i])) return null;
  const quoted = [];
  let next = i;
  for (; next < lines.length && /^\s*>/.test(lines[next]); next += 1) quoted.push(lines[next].replace(/^\s*> ?/, ""));
  return { node: el("blockquote", [render(quoted.join("\n"))]), next };
}

const ITEM = /^\s*([-*+]|\d+[.)])\s+(.*)$/;

// A list runs while its lines are items of its kind (ordered or not), or lines indented
// by two spaces or more that continue the item above.
function list(lines, i) {
  const m = /^\s*([-*+]|\d+[.)])\s+/.exec(lines[i]);
  if (!m) return null;
  const ordered = /\d/.test(m[1]);
  const items = [];
  let next = i;
  for (; next < lines.length; next += 1) {
    const item = ITEM.exec(lines[next]);
    if (item && /\d/.test(item[1]) === ordered) items.push(el("li", inline(item[2])));
    else if (lines[next].trim() && items.length && /^\s{2,}/.test(lines[next])) items.at(-1).append("\n", ...inline(lines[next].trim()));
    else break;
  }
  // no item (a marker line that ITEM's `.` cannot read to its end, as with U+2028 in
  // it): not a list, so the line is a paragraph's and the reader moves on
  if (!items.length) return null;
  return { node: el(ordered ? "ol" : "ul", items), next };
}

const BLOCKS = [fenced, heading, rule, quote, list];

function block(lines, i) {
  for (const read of BLOCKS) {
    const found = read(lines, i);
    if (found) return found;
  }
  return null;
}

export function render(markdown) {
  const fragment = document.createDocumentFragment();
  const lines = markdown.replace(/\r\n?/g, "\n").split("\n");
  const para = [];
  const flush = () => {
    if (para.length) fragment.append(el("p", inline(para.join("\n"))));
    para.length = 0;
  };
  for (let i = 0; i < lines.length; ) {
    const found = block(lines, i);
    if (found) {
      flush();
      fragment.append(found.node);
      i = found.next;
    } else {
      if (lines[i].trim()) para.push(lines[i]);
      else flush();
      i += 1;
    }
  }
  flush();
  return fragment;
}
