// The block grid: one square element per K/V block (.cell; .used with data-owner and the
// owning stream's colour; .mine for this tab's stream; .evicted for a moment after a live
// stream lost the block to its bounded history while keeping its newer blocks).
//
// A pool of thousands of blocks with a few streams in it would be a sea of grey, so the grid
// shows a window of the pool: every block in use plus headroom (at least MIN_VIEW blocks, and
// the whole pool when it is small). The pool hands out blocks in free-queue order, which sweeps
// the block ids round the pool, so the window is an arc of block ids (it may wrap past the
// last id) that stays put while the blocks in use fit in it, and moves or grows only when they
// leave it: live streams fill it from one side and evictions empty it from the other.
//
// The grid element carries data-num-blocks (the whole pool), data-num-used, data-num-mine,
// data-view-start and data-view-size. The same grid shows stream slots (unit "slot") for a
// model without paged blocks.

import { streamColor } from "./colors.js";

const MAX_CELL = 18;
const MIN_CELL = 2;
export const MIN_VIEW = 64;
const EVICTED_MS = 1200;

/**
 * The window of block ids to show: the arc [start, start + size) (mod the pool size) that holds
 * every block in use, with room to grow.
 * @param {Array<number|null>} owners owner stream id per block id (null = free)
 * @param {{start: number, size: number}|null} previous the window shown now
 * @returns {{start: number, size: number}}
 */
export function chooseView(owners, previous = null) {
  const total = owners.length;
  const used = [];
  owners.forEach((owner, id) => { if (owner !== null && owner !== undefined) used.push(id); });
  if (total <= 2 * MIN_VIEW) return { start: 0, size: total };
  const inArc = (id, view) => (id - view.start + total) % total < view.size;
  const wanted = Math.max(MIN_VIEW, 4 * used.length);
  if (previous && previous.size < total && used.every((id) => inArc(id, previous)) &&
      previous.size >= wanted / 2 && previous.size <= 4 * wanted) {
    return previous;  // still fits and is not far too large: keep it still
  }
  if (used.length === 0) return { start: previous ? previous.start : 0, size: MIN_VIEW };
  // the shortest arc holding every used block: it starts after the widest gap between them
  let gapEnd = used[0];
  let widest = used[0] + total - used[used.length - 1];
  for (let i = 1; i < used.length; i += 1) {
    const gap = used[i] - used[i - 1];
    if (gap > widest) { widest = gap; gapEnd = used[i]; }
  }
  const span = total - widest + 1;
  let size = MIN_VIEW;
  while (size < Math.max(wanted, span + span / 2)) size *= 2;
  if (size >= total) return { start: 0, size: total };
  // a little room behind the oldest block, the rest ahead for the blocks to come
  const start = (gapEnd - Math.floor((size - span) / 8) + total) % total;
  return { start, size };
}

export class PoolGrid {
  /** @param {HTMLElement} root the grid container */
  constructor(root) {
    this.root = root;
    this.cells = [];
    this.owners = [];
    this.shown = [];  // owner shown per cell
    this.view = null;
    this.unit = "block";
    this.myStreamId = null;
    this.evictedAt = new Map();  // block id -> time its live owner lost it
    new ResizeObserver(() => this.layout()).observe(root.parentElement);
  }

  setMyStream(streamId) {
    this.myStreamId = streamId;
    this.paint(true);
  }

  /**
   * @param {Array<number|null>} owners owner per block id (or per slot)
   * @param {number[]} activeIds live streams
   * @param {"block"|"slot"} unit what a cell stands for
   */
  update(owners, activeIds = [], unit = "block") {
    const relabel = unit !== this.unit;
    this.unit = unit;
    // a block freed while its stream lives on and keeps other blocks was evicted (a stream
    // whose blocks all went at once was reset at an endpoint, or ended)
    const active = new Set(activeIds);
    const holding = new Set(owners.filter((owner) => owner !== null && owner !== undefined));
    const now = performance.now();
    owners.forEach((owner, id) => {
      const before = this.owners[id];
      if ((owner === null || owner === undefined) && before !== null && before !== undefined &&
          active.has(before) && holding.has(before)) {
        this.evictedAt.set(id, now);
      }
    });
    this.owners = owners.slice();
    const view = chooseView(owners, this.view);
    if (!this.view || view.size !== this.view.size || view.start !== this.view.start) {
      this.view = view;
      this.rebuild();
    }
    this.paint(relabel);
  }

  rebuild() {
    this.root.textContent = "";
    this.cells = Array.from({ length: this.view.size }, () => {
      const cell = document.createElement("div");
      cell.className = "cell";
      return cell;
    });
    this.shown = new Array(this.view.size).fill(undefined);
    this.root.append(...this.cells);
    this.layout();
  }

  /** The largest square size (and gap) that shows every cell within the height budget. */
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

  paint(force) {
    const total = this.owners.length;
    const now = performance.now();
    let used = 0;
    let mine = 0;
    for (const owner of this.owners) {
      const taken = owner !== null && owner !== undefined;
      used += taken;
      mine += taken && owner === this.myStreamId;
    }
    this.cells.forEach((cell, index) => {
      const id = (this.view.start + index) % total;
      const owner = this.owners[id];
      const taken = owner !== null && owner !== undefined;
      const evictedAt = this.evictedAt.get(id);
      const evicted = !taken && evictedAt !== undefined && now - evictedAt < EVICTED_MS;
      if (evictedAt !== undefined && !evicted) this.evictedAt.delete(id);
      cell.classList.toggle("evicted", evicted);
      if (!force && this.shown[index] === owner && cell.dataset.block === String(id)) return;
      this.shown[index] = owner;
      cell.dataset.block = String(id);
      cell.style.background = taken ? streamColor(owner) : "";
      cell.classList.toggle("used", taken);
      cell.classList.toggle("mine", taken && owner === this.myStreamId);
      cell.title = taken ? `${this.unit} ${id}: stream ${owner}` : `${this.unit} ${id}: free`;
      if (taken) cell.dataset.owner = String(owner);
      else delete cell.dataset.owner;
    });
    const data = this.root.dataset;
    data.numBlocks = String(total);
    data.numUsed = String(used);
    data.numMine = String(mine);
    data.viewStart = String(this.view ? this.view.start : 0);
    data.viewSize = String(this.view ? this.view.size : 0);
  }
}
