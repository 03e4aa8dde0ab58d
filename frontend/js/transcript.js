// The transcript: one line per segment, in segment order. A segment shows its live partial
// until its final arrives (plain text with its times). A partial has up to three parts: the
// stable words (committed by the Whisper refinements: they never change, shown plain), the
// newest refinement's tentative words (dimmed), and the streaming CTC pass's newest words
// (dimmed, italic). With a second pass the
// final of segment n can arrive after partials of segment n + 1: each line is keyed by its
// segment number, so both stay where they belong. Each run (mic or file) is its own block.
// Every word carries its time and confidence (the server's "words"): shown on hover, and a
// word the recogniser was unsure of (confidence below UNSURE) is underlined.

const UNSURE = 0.5;

/** Append ``text``'s words to ``parent`` as spans, each titled with its entry of ``words``
 * (from ``offset`` on, in order) when there is one; returns how many entries it used. */
function appendWords(parent, text, words, offset) {
  const tokens = text.split(/\s+/).filter(Boolean);
  tokens.forEach((token, i) => {
    if (i) parent.append(" ");
    const info = words[offset + i];
    const span = document.createElement("span");
    span.className = "word";
    span.textContent = token;
    if (info && info.word === token) {
      span.title = `${info.start.toFixed(2)}-${info.end.toFixed(2)} s, ` +
        `confidence ${Math.round(100 * info.confidence)} %`;
      span.dataset.confidence = String(info.confidence);
      if (info.confidence < UNSURE) span.dataset.unsure = "";
    }
    parent.append(span);
  });
  return tokens.length;
}

export class TranscriptView {
  /** @param {HTMLElement} root the transcript container */
  constructor(root) {
    this.root = root;
    this.run = null;
    this.lines = new Map();  // segment number -> its line in the current run
  }

  /** Start a new block for a new stream, labelled (e.g. "mic" or a file name). */
  beginRun(label) {
    this.root.querySelector(".placeholder")?.remove();
    this.run = document.createElement("section");
    this.run.className = "run";
    const heading = document.createElement("h3");
    heading.className = "run-label";
    heading.textContent = label;
    this.run.append(heading);
    this.root.append(this.run);
    this.lines = new Map();
  }

  line(segment) {
    if (!this.run) this.beginRun("stream");
    let line = this.lines.get(segment);
    if (!line) {
      line = document.createElement("p");
      line.className = "segment partial";
      line.dataset.segment = String(segment);
      const later = [...this.lines.entries()].filter(([s]) => s > segment).map(([, l]) => l);
      if (later.length) this.run.insertBefore(line, later[0]);
      else this.run.append(line);
      this.lines.set(segment, line);
    }
    return line;
  }

  /** Show or replace the live hypothesis of a segment that is not final yet. */
  partial({ segment, text, stable = "", tentative = "", ctc = text, words = [] }) {
    if (!this.lines.has(segment) && !(stable || tentative || ctc)) return;  // no words yet
    const line = this.line(segment);
    if (line.classList.contains("final")) return;
    line.textContent = "";
    let used = 0;
    for (const [part, partText] of [["stable", stable], ["tentative", tentative], ["ctc", ctc]]) {
      if (!partText) continue;
      if (line.childNodes.length) line.append(" ");
      const span = document.createElement("span");
      span.className = part;
      used += appendWords(span, partText, words, used);
      line.append(span);
    }
    this.scroll();
  }

  /** Turn a segment into a finished line: its times, its words and, if any, who decoded it. */
  final({ segment, text, start, end, source, words = [] }) {
    const line = this.line(segment);
    if (!/[\p{L}\p{N}]/u.test(text ?? "")) {  // no words: the second pass heard no speech here
      line.remove();
      this.lines.delete(segment);
      return;
    }
    line.className = "segment final";
    line.textContent = "";
    const time = document.createElement("span");
    time.className = "time";
    time.textContent = `${start.toFixed(1)}-${end.toFixed(1)} s`;
    const wordsSpan = document.createElement("span");
    wordsSpan.className = "words";
    appendWords(wordsSpan, text, words, 0);
    line.append(time, wordsSpan);
    const tags = {
      whisper: ["2nd pass", "re-decoded by the Whisper second pass"],
      combined: ["2nd pass + CTC", "combined from the Whisper and CTC passes (a digit " +
        "string, or hotwords the CTC pass spelled)"],
    };
    if (source in tags) {
      const tag = document.createElement("span");
      tag.className = "source";
      [tag.textContent, tag.title] = tags[source];
      line.append(tag);
    }
    this.scroll();
  }

  /**
   * A short note that ends the current run (finish reason, errors). Every final of the stream
   * has arrived by then, so a line still partial never became a final: it is removed.
   */
  note(text, kind = "info") {
    if (!this.run) this.beginRun("stream");
    for (const [segment, line] of this.lines) {
      if (line.classList.contains("partial")) {
        line.remove();
        this.lines.delete(segment);
      }
    }
    const line = document.createElement("p");
    line.className = `note ${kind}`;
    line.textContent = text;
    this.run.append(line);
    this.scroll();
  }

  clear() {
    this.root.textContent = "";
    this.run = null;
    this.lines = new Map();
  }

  scroll() {
    this.root.scrollTop = this.root.scrollHeight;
  }
}
