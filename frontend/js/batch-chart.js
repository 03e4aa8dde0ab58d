// Batch width per engine step as a small live bar chart (SVG): one bar per recent busy step,
// its height the number of streams that step ran in one batched encoder forward. Bars are
// keyed by step number, so the strip scrolls as steps happen even when the widths repeat
// (alternate steps are shaded apart). The chart element carries data-series (the widths,
// comma-separated, oldest first), data-max-width and data-last-step.

const SVG = "http://www.w3.org/2000/svg";
const HEIGHT = 56;
const BAR_SLOTS = 64;

export class BatchChart {
  /**
   * @param {SVGSVGElement} svg the chart
   * @param {HTMLElement} caption the line of text under it
   */
  constructor(svg, caption) {
    this.svg = svg;
    this.caption = caption;
    this.svg.setAttribute("viewBox", `0 0 ${BAR_SLOTS} ${HEIGHT}`);
    this.svg.setAttribute("preserveAspectRatio", "none");
    this.lastKey = "";
  }

  /**
   * @param {number[]} widths batch width of each recent busy step, oldest first
   * @param {number} numSteps busy steps so far (the newest bar's step number)
   */
  update(widths, numSteps) {
    const key = `${numSteps}:${widths.join(",")}`;
    if (key === this.lastKey) return;
    this.lastKey = key;
    const top = Math.max(2, ...widths);
    this.svg.textContent = "";
    for (let level = 1; level < top; level += Math.max(1, Math.ceil(top / 4))) {
      const y = HEIGHT - (level / top) * (HEIGHT - 2);
      const line = document.createElementNS(SVG, "line");
      line.setAttribute("x1", "0");
      line.setAttribute("x2", String(BAR_SLOTS));
      line.setAttribute("y1", String(y));
      line.setAttribute("y2", String(y));
      line.setAttribute("class", "level");
      this.svg.append(line);
    }
    const offset = BAR_SLOTS - widths.length;
    widths.forEach((width, index) => {
      const step = numSteps - widths.length + index + 1;
      const bar = document.createElementNS(SVG, "rect");
      const h = (width / top) * (HEIGHT - 2);
      bar.setAttribute("x", String(offset + index + 0.1));
      bar.setAttribute("width", "0.8");
      bar.setAttribute("y", String(HEIGHT - h));
      bar.setAttribute("height", String(h));
      bar.setAttribute("class", `bar${step % 2 ? " odd" : ""}${width > 1 ? " batched" : ""}`);
      const title = document.createElementNS(SVG, "title");
      title.textContent = `step ${step}: ${width} stream${width === 1 ? "" : "s"}`;
      bar.append(title);
      this.svg.append(bar);
    });
    const data = this.svg.dataset;
    data.series = widths.join(",");
    data.maxWidth = String(widths.length ? Math.max(...widths) : 0);
    data.lastStep = String(numSteps);
    if (!widths.length) {
      this.caption.textContent = "No step has run yet.";
      return;
    }
    const mean = widths.reduce((a, b) => a + b, 0) / widths.length;
    const batched = widths.filter((w) => w > 1).length;
    this.caption.textContent = `Last ${widths.length} steps: now ${widths[widths.length - 1]}, ` +
      `max ${Math.max(...widths)}, mean ${mean.toFixed(1)} streams per forward; ` +
      `${batched} step${batched === 1 ? "" : "s"} ran more than one stream (scale 0–${top}).`;
  }
}
