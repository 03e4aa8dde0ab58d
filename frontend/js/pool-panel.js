// The pool panel: the whole pool as a bar (pool-overview.js), the block grid zoomed on the
// blocks in use (pool-grid.js), batch width per step (batch-chart.js), the second pass
// (second-pass-view.js) and the engine's counters (occupancy, evictions, streams, finish
// reasons, step time, real-time factor).

import { BatchChart } from "./batch-chart.js";
import { streamColor } from "./colors.js";
import { PoolGrid } from "./pool-grid.js";
import { PoolOverview } from "./pool-overview.js";
import { SecondPassView } from "./second-pass-view.js";

const FINISH_REASONS = ["stop", "length", "timeout", "abort", "error"];

function fmt(value, digits = 1) {
  return typeof value === "number" && Number.isFinite(value) ? value.toFixed(digits) : "-";
}

function describeHistory(numLeftChunks, chunkMs) {
  if (typeof numLeftChunks !== "number") return "-";
  if (numLeftChunks < 0) return "unbounded (no evictions)";
  const seconds = chunkMs ? ` = ${((numLeftChunks * chunkMs) / 1000).toFixed(1)} s` : "";
  return `${numLeftChunks} chunks${seconds}; older blocks are evicted`;
}

export class PoolPanel {
  /** @param {HTMLElement} root the panel element holding the [data-*] slots of index.html */
  constructor(root) {
    this.root = root;
    this.grid = root.querySelector("[data-grid]");
    this.poolGrid = new PoolGrid(this.grid);
    this.overview = new PoolOverview(root.querySelector("[data-overview]"),
      root.querySelector("[data-overview-caption]"));
    this.chart = new BatchChart(root.querySelector("[data-batch-chart]"),
      root.querySelector("[data-batch-caption]"));
    this.secondPass = new SecondPassView(root.querySelector("[data-second-pass]"));
    this.legend = root.querySelector("[data-legend]");
    this.reasons = root.querySelector("[data-reasons]");
    this.myStreamId = null;
  }

  /** Mark the stream this tab owns (its cells get an outline, its legend row a label). */
  setMyStream(streamId) {
    this.myStreamId = streamId;
    this.poolGrid.setMyStream(streamId);
  }

  field(name, text) {
    const node = this.root.querySelector(`[data-field="${name}"]`);
    if (node) node.textContent = text;
  }

  update(snapshot) {
    const { pool, streams, step } = snapshot;
    const owners = pool.owners || [];
    this.poolGrid.update(owners, (streams.list || []).map((s) => s.stream_id));
    this.overview.update(owners, this.poolGrid.view || { start: 0, size: owners.length });
    this.chart.update(step.recent_batch_sizes || [], step.num_steps || 0);
    const percent = pool.num_blocks ? (100 * pool.num_used_blocks) / pool.num_blocks : 0;
    this.field("occupancy", `${pool.num_used_blocks} / ${pool.num_blocks} blocks (${fmt(percent)}%)`);
    this.field("evictions", String(snapshot.num_evictions));
    this.field("active", `${streams.active} / ${streams.max_batch_size}`);
    this.field("waiting", String(streams.waiting));
    this.field("step", `${fmt(step.last_ms)} ms (avg ${fmt(step.avg_ms)}, batch ${step.last_batch_size})`);
    this.field("rtf", fmt(snapshot.rtf, 3));
    this.field("steps", String(step.num_steps));
    const model = snapshot.model || {};
    this.field("model", `${model.name || "?"} · ${model.chunk_ms || "?"} ms chunks · ${model.device || "?"}`);
    this.field("history", describeHistory(model.num_left_chunks, model.chunk_ms));
    this.field("uptime", `${fmt(snapshot.uptime_s, 0)} s`);
    this.secondPass.update(snapshot.second_pass);
    if (snapshot.server) {
      this.field("connections", `${snapshot.server.connections} / ${snapshot.server.max_connections}`);
    }
    this.grid.setAttribute("aria-label",
      `Block pool: ${pool.num_used_blocks} of ${pool.num_blocks} blocks in use by ${streams.active} streams`);
    this.paintReasons(snapshot.finish_reasons || {});
    this.paintLegend(streams.list || [], pool.block_size_frames);
  }

  paintReasons(counts) {
    this.reasons.textContent = "";
    for (const reason of FINISH_REASONS) {
      const item = document.createElement("li");
      item.innerHTML = "<span class=\"reason\"></span><span class=\"count\"></span>";
      item.firstChild.textContent = reason;
      item.lastChild.textContent = String(counts[reason] ?? 0);
      this.reasons.append(item);
    }
  }

  paintLegend(list, blockFrames) {
    this.legend.textContent = "";
    if (list.length === 0) {
      const empty = document.createElement("li");
      empty.className = "empty";
      empty.textContent = "No active streams: press the mic button, or open a second tab.";
      this.legend.append(empty);
      return;
    }
    for (const stream of list) {
      const item = document.createElement("li");
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = streamColor(stream.stream_id);
      const label = document.createElement("span");
      const mine = stream.stream_id === this.myStreamId ? " (this tab)" : "";
      label.textContent = `stream ${stream.stream_id}${mine}: ${stream.num_blocks} blocks` +
        ` (${stream.num_blocks * (blockFrames || 0)} frames), ${fmt(stream.audio_s)} s audio,` +
        ` lag ${fmt(stream.lag_s, 2)} s`;
      item.append(swatch, label);
      this.legend.append(item);
    }
  }
}
