// The transcript: finished segments (plain) followed by the live partial (dimmed, italic),
// one line per segment, keyed by segment number. With the second pass on, a segment's final
// (Whisper's text) can arrive after the next segment's partials: its line stays a partial,
// marked pending, until then. Each run (mic or file) starts a new block.

export class TranscriptView {
  /** @param {HTMLElement} root the transcript container */
  constructor(root) {
    this.root = root;
    this.run = null;
    this.lines = new Map();
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

  ensureRun() {
    if (!this.run) this.beginRun("stream");
  }

  /** The line of a segment, created (as a partial) on first use. */
  line(segment) {
    this.ensureRun();
    let line = this.lines.get(segment);
    if (!line) {
      line = document.createElement("p");
      line.className = "segment partial";
      line.dataset.segment = String(segment);
      this.run.append(line);
      this.lines.set(segment, line);
    }
    return line;
  }

  /** Show or replace the live hypothesis of a segment; earlier unfinished ones wait. */
  partial({ segment, text }) {
    for (const [other, line] of this.lines) {
      if (other < segment && line.classList.contains("partial")) line.classList.add("pending");
    }
    this.line(segment).textContent = text;
    this.scroll();
  }

  /** Turn a segment into a finished line (``source``: "whisper" or "ctc"). */
  final({ segment, text, start, end, source }) {
    const line = this.line(segment);
    line.className = "segment final";
    line.dataset.source = source || "ctc";
    line.title = source === "whisper" ? "final text from the Whisper second pass"
      : "final text from the streaming CTC pass";
    line.textContent = "";
    const time = document.createElement("span");
    time.className = "time";
    time.textContent = `${start.toFixed(1)}-${end.toFixed(1)} s`;
    const words = document.createElement("span");
    words.className = "words";
    words.textContent = text;
    line.append(time, words);
    this.scroll();
  }

  /** A short note inside the current run (finish reason, errors). */
  note(text, kind = "info") {
    this.ensureRun();
    for (const [segment, line] of this.lines) {
      if (line.classList.contains("partial") && !line.textContent) {
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

  /** The finished text of the current run, segments joined by spaces. */
  finalText() {
    if (!this.run) return "";
    return [...this.run.querySelectorAll(".segment.final .words")]
      .map((node) => node.textContent).join(" ");
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
