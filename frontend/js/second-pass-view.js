// The second pass in the panel: finals by the pass that wrote their text ("whisper",
// "combined": a digit string repaired from both passes, "ctc": the streaming pass's text
// kept), why the CTC text was kept (the guard rejected Whisper's text, the backlog was full,
// or the final waited too long while Whisper yielded to live streams behind real time),
// Whisper's own temperature fallbacks, its backlog and latency, and, when the snapshot has
// them (a server that refines partials with Whisper), how many refinements are in flight, how
// often a stream's partial is refined and how many streams have refined partials. Counts only.

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
    // held: the streams are behind real time and Whisper waits for them (partials first)
    const waiting = pass.held ? " Waiting now: the live streams are behind real time." : "";
    this.summary.textContent = `Whisper tiny.en re-decodes each finished segment: backlog ` +
      `${pass.backlog}, average ${latency} ms from segment end to final.${waiting}`;
    this.root.dataset.held = String(Boolean(pass.held));
    const bySource = finalsBySource(pass);
    this.sources.replaceChildren(...SOURCES.map(([key, label]) => chip(label, bySource[key], key)));
    this.fallbacks.replaceChildren(
      chip("temperature fallbacks", pass.num_temperature_fallbacks, "temperature"),
      chip("rejected by the guard", pass.num_rejected, "rejected"),
      chip("backlog full", pass.num_backlog_full, "backlog_full"),
      chip("waited too long (streams behind)", pass.num_expired ?? 0, "expired"),
      chip("gave way to a live stream", pass.num_evicted ?? 0, "evicted"),
      chip("early decodes cut short", pass.num_decodes_cancelled ?? 0, "cancelled"),
      // Whisper ended right after the previous segment's text: decoded again without it
      chip("redone without the previous text", pass.num_context_retries ?? 0, "context_retries"),
    );
    this.paintRefine(pass);
  }

  /** Refined partials: shown when the snapshot has them (a server that refines), else hidden. */
  paintRefine(pass) {
    const refining = typeof pass.num_refining === "number" && pass.refine !== false;
    this.refine.hidden = !refining;
    if (!refining) return;
    const every = typeof pass.refine_interval_s === "number" && pass.refine_interval_s > 0
      ? `, one every ${pass.refine_interval_s.toFixed(1)} s per stream` : "";
    const streams = typeof pass.num_refined_streams === "number"
      ? `; ${pass.num_refined_streams} live stream${pass.num_refined_streams === 1 ? "" : "s"}` +
        " with refined partials" : "";
    const total = typeof pass.num_refinements === "number"
      ? ` (${pass.num_refinements} refinements so far)` : "";
    this.refine.textContent = `Refining partials: ${pass.num_refining} in flight${every}` +
      `${streams}${total}.`;
    this.refine.dataset.numRefining = String(pass.num_refining);
  }
}
