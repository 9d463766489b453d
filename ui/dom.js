// Builds DOM nodes without ever parsing HTML: every string from the API reaches the page as a
// text node, so a job payload or error message cannot inject markup.

const SVG_NS = 'http://www.w3.org/2000/svg';

// h('a', {href: '#/', class: 'x', onclick: fn}, 'text', child) -> HTMLElement.
// Attributes named on* become listeners; `false`, null and undefined attributes are left out;
// children may be nodes, strings, numbers, or (nested) arrays of those; null is skipped.
export function h(tag, attrs = {}, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

// The same for SVG elements (the charts).
export function svg(tag, attrs = {}, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

function fill(el, attrs, children) {
  for (const [name, value] of Object.entries(attrs ?? {})) {
    if (value === false || value === null || value === undefined) continue;
    if (name.startsWith('on') && typeof value === 'function') {
      el.addEventListener(name.slice(2), value);
    } else {
      el.setAttribute(name, value === true ? '' : String(value));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : String(child));
  }
}

// Replaces everything inside `el` with `children`.
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// Sets a node's text only when it changed, so that screen readers and text selection are not
// disturbed by the periodic refresh.
export function setText(el, text) {
  const s = String(text);
  if (el.textContent !== s) el.textContent = s;
}
