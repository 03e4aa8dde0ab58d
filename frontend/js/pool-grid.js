// The block grid: one square element per K/V block (.cell; .used with data-owner and the
// owning stream's colour; .mine for this tab's stream), sized so the whole pool is visible at
// once: 18 px squares for small pools down to 2 px for pools of tens of thousands of blocks.
// The grid element carries data-num-blocks, data-num-used and data-num-mine. The same grid
// shows stream slots (unit "slot") for a model without paged blocks.

import { streamColor } from "./colors.js";

const MAX_CELL = 18;
const MIN_CELL = 2;

export class PoolGrid {
  /** @param {HTMLElement} root the grid container */
  constructor(root) {
    this.root = root;
    this.cells = [];
    this.owners = [];
    this.myStreamId = null;
    this.unit = "block";
    new ResizeObserver(() => this.layout()).observe(root.parentElement);
  }

  setMyStream(streamId) {
    this.myStreamId = streamId;
    this.paint(this.owners, true);
  }

  update(owners, unit = "block") {
    const relabel = unit !== this.unit;
    this.unit = unit;
    if (owners.length !== this.cells.length) this.rebuild(owners.length);
    this.paint(owners, relabel);
  }

  rebuild(count) {
    this.root.textContent = "";
    this.cells = Array.from({ length: count }, (_, index) => {
      const cell = document.createElement("div");
      cell.className = "cell";
      cell.dataset.block = String(index);
      return cell;
    });
    this.root.append(...this.cells);
    this.owners = [];
    this.layout();
  }

  /** The largest square size (and gap) that shows every block within the height budget. */
  layout() {
    const count = Math.max(this.cells.length, 1);
    const width = Math.max(this.root.parentElement.clientWidth, 100);
    const maxHeight = Math.max(120, Math.min(window.innerHeight * 0.4, 360));
    let cell = MAX_CELL;
    while (cell > MIN_CELL && Math.ceil(count / Math.floor(width / cell)) * cell > maxHeight) {
      cell -= 1;
    }
    const gap = cell >= 8 ? 2 : cell >= 4 ? 1 : 0;
    this.root.style.setProperty("--cell", `${cell - gap}px`);
    this.root.style.setProperty("--gap", `${gap}px`);
  }

  paint(owners, force) {
    let used = 0;
    let mine = 0;
    owners.forEach((owner, index) => {
      const taken = owner !== null && owner !== undefined;
      const isMine = taken && owner === this.myStreamId;
      used += taken;
      mine += isMine;
      if (!force && this.owners[index] === owner) return;
      const cell = this.cells[index];
      cell.style.background = taken ? streamColor(owner) : "";
      cell.classList.toggle("used", taken);
      cell.classList.toggle("mine", isMine);
      cell.title = taken ? `${this.unit} ${index}: stream ${owner}` : `${this.unit} ${index}: free`;
      if (taken) cell.dataset.owner = String(owner);
      else delete cell.dataset.owner;
    });
    this.owners = owners.slice();
    this.root.dataset.numBlocks = String(owners.length);
    this.root.dataset.numUsed = String(used);
    this.root.dataset.numMine = String(mine);
  }
}
