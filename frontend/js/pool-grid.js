// The block grid on a canvas: one square per K/V block, coloured by the owning stream, sized so
// the whole pool is visible at once (from 18 px squares for small pools down to 2 px for pools
// of tens of thousands of blocks). The canvas element carries data-num-blocks, data-num-used
// and data-num-mine for tests and tools; hovering a square names its block and owner.

import { streamColor } from "./colors.js";

const FREE = "#e3e6ec";
const MAX_CELL = 18;
const MIN_CELL = 2;

export class PoolGrid {
  /** @param {HTMLCanvasElement} canvas */
  constructor(canvas) {
    this.canvas = canvas;
    this.owners = [];
    this.myStreamId = null;
    this.layout = { cell: MAX_CELL, cols: 1 };
    canvas.addEventListener("mousemove", (event) => this.describe(event));
    new ResizeObserver(() => this.draw()).observe(canvas.parentElement);
  }

  setMyStream(streamId) {
    this.myStreamId = streamId;
    this.draw();
  }

  update(owners) {
    this.owners = owners;
    this.draw();
  }

  computeLayout(count) {
    const width = Math.max(this.canvas.parentElement.clientWidth, 100);
    const maxHeight = Math.max(120, Math.min(window.innerHeight * 0.4, 360));
    let cell = Math.floor(Math.sqrt((width * maxHeight) / Math.max(count, 1)));
    cell = Math.max(MIN_CELL, Math.min(MAX_CELL, cell));
    let cols = Math.max(1, Math.floor(width / cell));
    while (cell > MIN_CELL && Math.ceil(count / cols) * cell > maxHeight) {
      cell -= 1;
      cols = Math.max(1, Math.floor(width / cell));
    }
    return { cell, cols, width, rows: Math.ceil(count / cols) };
  }

  draw() {
    const owners = this.owners;
    const layout = this.computeLayout(owners.length);
    this.layout = layout;
    const ratio = window.devicePixelRatio || 1;
    const height = Math.max(layout.rows * layout.cell, layout.cell);
    this.canvas.style.width = `${layout.cols * layout.cell}px`;
    this.canvas.style.height = `${height}px`;
    this.canvas.width = Math.round(layout.cols * layout.cell * ratio);
    this.canvas.height = Math.round(height * ratio);
    const g = this.canvas.getContext("2d");
    g.scale(ratio, ratio);
    const gap = layout.cell >= 6 ? 2 : layout.cell >= 4 ? 1 : 0;
    const side = layout.cell - gap;
    let used = 0;
    let mine = 0;
    owners.forEach((owner, index) => {
      const x = (index % layout.cols) * layout.cell;
      const y = Math.floor(index / layout.cols) * layout.cell;
      const taken = owner !== null && owner !== undefined;
      used += taken;
      g.fillStyle = taken ? streamColor(owner) : FREE;
      g.fillRect(x, y, side, side);
      if (taken && owner === this.myStreamId) {
        mine += 1;
        if (side >= 6) {
          g.strokeStyle = "rgba(0, 0, 0, 0.6)";
          g.lineWidth = 2;
          g.strokeRect(x + 1, y + 1, side - 2, side - 2);
        }
      }
    });
    this.canvas.dataset.numBlocks = String(owners.length);
    this.canvas.dataset.numUsed = String(used);
    this.canvas.dataset.numMine = String(mine);
  }

  describe(event) {
    const rect = this.canvas.getBoundingClientRect();
    const { cell, cols } = this.layout;
    const col = Math.floor((event.clientX - rect.left) / cell);
    const index = Math.floor((event.clientY - rect.top) / cell) * cols + col;
    if (col >= cols || index < 0 || index >= this.owners.length) return;
    const owner = this.owners[index];
    this.canvas.title = owner === null || owner === undefined
      ? `block ${index}: free` : `block ${index}: stream ${owner}`;
  }
}
