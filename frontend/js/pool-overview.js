// The whole pool as one bar: a canvas strip where each column stands for a run of block ids,
// coloured by the stream owning the first used block in it (grey when all are free), with the
// grid's window outlined. Its text says how much of the pool is in use and which blocks the grid
// shows. The bar element carries data-num-blocks, data-num-used, data-view-start, data-view-size.

import { streamColor } from "./colors.js";

const HEIGHT = 14;

export class PoolOverview {
  /**
   * @param {HTMLCanvasElement} canvas the bar
   * @param {HTMLElement} caption the line of text under it
   */
  constructor(canvas, caption) {
    this.canvas = canvas;
    this.caption = caption;
    this.owners = [];
    this.view = { start: 0, size: 0 };
    new ResizeObserver(() => this.draw()).observe(canvas.parentElement);
  }

  /**
   * @param {Array<number|null>} owners owner per block id (or per slot)
   * @param {{start: number, size: number}} view the grid's window
   * @param {"block"|"slot"} unit what an entry stands for
   */
  update(owners, view, unit = "block") {
    this.owners = owners;
    this.view = view;
    this.draw();
    const total = owners.length;
    const used = owners.reduce((n, owner) => n + (owner !== null && owner !== undefined), 0);
    const data = this.canvas.dataset;
    data.numBlocks = String(total);
    data.numUsed = String(used);
    data.viewStart = String(view.start);
    data.viewSize = String(view.size);
    const percent = total ? ((100 * used) / total).toFixed(1) : "0.0";
    const last = (view.start + view.size - 1) % Math.max(total, 1);
    this.caption.textContent = view.size >= total
      ? `${used} of ${total.toLocaleString("en")} ${unit}s in use (${percent}%); the grid shows them all.`
      : `${used} of ${total.toLocaleString("en")} ${unit}s in use (${percent}%); the grid shows ` +
        `${view.size} of them, ${unit}s ${view.start}–${last} (outlined).`;
  }

  draw() {
    const ratio = window.devicePixelRatio || 1;
    const width = Math.max(this.canvas.parentElement.clientWidth, 100);
    this.canvas.style.width = `${width}px`;
    this.canvas.style.height = `${HEIGHT}px`;
    this.canvas.width = Math.round(width * ratio);
    this.canvas.height = Math.round(HEIGHT * ratio);
    const ctx = this.canvas.getContext("2d");
    ctx.scale(ratio, ratio);
    ctx.fillStyle = getComputedStyle(this.canvas).getPropertyValue("--free").trim() || "#e3e6ec";
    ctx.fillRect(0, 0, width, HEIGHT);
    const total = this.owners.length;
    if (!total) return;
    const perPixel = total / width;
    for (let x = 0; x < width; x += 1) {
      const first = Math.floor(x * perPixel);
      const end = Math.max(first + 1, Math.floor((x + 1) * perPixel));
      for (let id = first; id < end && id < total; id += 1) {
        const owner = this.owners[id];
        if (owner !== null && owner !== undefined) {
          ctx.fillStyle = streamColor(owner);
          ctx.fillRect(x, 0, 1, HEIGHT);
          break;
        }
      }
    }
    if (this.view.size > 0 && this.view.size < total) this.outline(ctx, width, total);
  }

  outline(ctx, width, total) {
    ctx.strokeStyle = "rgba(29, 35, 48, 0.85)";
    ctx.lineWidth = 2;
    const x0 = (this.view.start / total) * width;
    const w = Math.max(3, (this.view.size / total) * width);
    ctx.strokeRect(x0 + 1, 1, Math.min(w, width - x0) - 2, HEIGHT - 2);
    if (x0 + w > width) ctx.strokeRect(1, 1, x0 + w - width, HEIGHT - 2);  // the arc wraps
  }
}
