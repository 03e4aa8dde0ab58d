// The transcript: finished segments (plain) followed by the live partial (dimmed, italic),
// one line per segment. Each run (mic or file) starts a new block.

export class TranscriptView {
  /** @param {HTMLElement} root the transcript container */
  constructor(root) {
    this.root = root;
    this.run = null;
    this.partialLine = null;
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
    this.partialLine = null;
  }

  ensureRun() {
    if (!this.run) this.beginRun("stream");
  }

  /** Show or replace the live hypothesis of the current segment. */
  partial({ segment, text }) {
    this.ensureRun();
    if (!this.partialLine) {
      this.partialLine = document.createElement("p");
      this.partialLine.className = "segment partial";
      this.run.append(this.partialLine);
    }
    this.partialLine.dataset.segment = String(segment);
    this.partialLine.textContent = text;
    this.scroll();
  }

  /** Turn the current segment into a finished line. */
  final({ segment, text, start, end }) {
    this.ensureRun();
    const line = this.partialLine || document.createElement("p");
    if (!this.partialLine) this.run.append(line);
    this.partialLine = null;
    line.className = "segment final";
    line.dataset.segment = String(segment);
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
    if (this.partialLine && !this.partialLine.textContent) {
      this.partialLine.remove();
      this.partialLine = null;
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
    this.partialLine = null;
  }

  scroll() {
    this.root.scrollTop = this.root.scrollHeight;
  }
}
