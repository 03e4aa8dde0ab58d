// The second pass in the panel: finals by the pass that wrote their text ("whisper",
// "combined": a digit string repaired from both passes, "ctc": the streaming pass's text
// kept), why the CTC text was kept (the guard rejected Whisper's text, the backlog was full),
// Whisper's own temperature fallbacks, its backlog and latency, and, when the server refines
// partials with it, how many streams are being refined and how often. Counts only.

const SOURCES = [
  ["whisper", "Whisper"],
  ["combined", "combined"],
  ["ctc", "CTC kept"],
];

function chip(label, count, key) {
  const item = document.createElement("li");
  item.dataset.key = key;
  const name = document.createElement("span");
  name.className = "reason";
  name.textContent = label;
  const value = document.createElement("span");
  value.className = "count";
  value.textContent = String(count ?? 0);
  item.append(name, value);
  return item;
}

/** Finals by source; servers without the counter get it from the older totals. */
function finalsBySource(pass) {
  if (pass.finals_by_source) return pass.finals_by_source;
  const combined = pass.num_combined ?? 0;
  return { whisper: Math.max(0, (pass.num_second_pass_finals ?? 0) - combined), combined,
           ctc: pass.num_first_pass_finals ?? 0 };
}

export class SecondPassView {
  /** @param {HTMLElement} root the element holding the [data-sp-*] slots of index.html */
  constructor(root) {
    this.root = root;
    this.summary = root.querySelector("[data-sp-summary]");
    this.sources = root.querySelector("[data-sp-sources]");
    this.fallbacks = root.querySelector("[data-sp-fallbacks]");
    this.refine = root.querySelector("[data-sp-refine]");
  }

  update(pass) {
    const enabled = Boolean(pass && pass.enabled);
    this.root.dataset.enabled = String(enabled);
    this.sources.hidden = !enabled;
    this.fallbacks.hidden = !enabled;
    if (!enabled) {
      this.summary.textContent = "Off: every final is the CTC text.";
      this.refine.hidden = true;
      return;
    }
    const latency = Number(pass.avg_latency_ms || 0).toFixed(0);
    this.summary.textContent = `Whisper tiny.en re-decodes each finished segment: backlog ` +
      `${pass.backlog}, average ${latency} ms from segment end to final.`;
    const bySource = finalsBySource(pass);
    this.sources.replaceChildren(...SOURCES.map(([key, label]) => chip(label, bySource[key], key)));
    this.fallbacks.replaceChildren(
      chip("temperature fallbacks", pass.num_temperature_fallbacks, "temperature"),
      chip("rejected by the guard", pass.num_rejected, "rejected"),
      chip("backlog full", pass.num_backlog_full, "backlog_full"),
    );
    const refining = typeof pass.num_refining === "number";
    this.refine.hidden = !refining;
    if (refining) {
      const every = typeof pass.refine_interval_s === "number"
        ? ` every ${pass.refine_interval_s.toFixed(1)} s` : "";
      this.refine.textContent = `Refining the partials of ${pass.num_refining} ` +
        `stream${pass.num_refining === 1 ? "" : "s"}${every}.`;
    }
  }
}
