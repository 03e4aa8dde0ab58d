// The pool panel: the block grid (pool-grid.js) and the engine's
// counters (occupancy, evictions, streams, admission, finish reasons, step time, real-time
// factor).
// A slot-runtime model (pool.kind "slots": the Zipformer) has no paged blocks: the grid then
// shows one cell per stream slot and the occupancy counts slots.
// The panel also shows the whole pool as a bar (pool-overview.js), the grid zoomed on the
// blocks in use (pool-grid.js), batch width per step (batch-chart.js) and the second pass
// (second-pass-view.js).

import { BatchChart } from "./batch-chart.js";
import { streamColor } from "./colors.js";
import { PoolGrid } from "./pool-grid.js";
import { PoolOverview } from "./pool-overview.js";
import { SecondPassView } from "./second-pass-view.js";

const FINISH_REASONS = ["stop", "length", "timeout", "abort", "abandoned", "error"];
const LATE_S = 1; // a stream this far behind (audio not decoded) is shown late

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

  /** Mark the stream this tab owns (its cells get an outline, its legend row a label), and
   * the replica it landed on (behind a load balancer, the panel says whether it shows that
   * replica's pool). */
  setMyStream(streamId, replica = null) {
    this.myStreamId = streamId;
    this.myReplica = replica;
    this.poolGrid.setMyStream(streamId);
  }

  field(name, text) {
    const node = this.root.querySelector(`[data-field="${name}"]`);
    if (node) node.textContent = text;
  }

  update(snapshot) {
    const { pool, streams, step } = snapshot;
    const slots = pool.kind === "slots";
    const owners = (slots ? pool.slot_owners : pool.owners) || [];
    this.poolGrid.update(owners, (streams.list || []).map((s) => s.stream_id),
      slots ? "slot" : "block");
    this.overview.update(owners, this.poolGrid.view || { start: 0, size: owners.length },
      slots ? "slot" : "block");
    this.chart.update(step.recent_batch_sizes || [], step.num_steps || 0);
    const [used, total] = slots ? [pool.num_used_slots, pool.num_slots]
      : [pool.num_used_blocks, pool.num_blocks];
    const percent = total ? (100 * used) / total : 0;
    this.field("occupancy", slots
      ? `${used} / ${total} slots (${fmt(percent)}%) · no paged blocks: fixed-size slot state`
      : `${used} / ${total} blocks (${fmt(percent)}%)`);
    this.field("evictions", String(snapshot.num_evictions));
    this.field("active", `${streams.active} / ${streams.max_batch_size}`);
    this.field("waiting", String(streams.waiting));
    this.field("suspended", String(streams.suspended ?? 0));
    this.field("lag", describeLag(streams.lag));
    this.field("admission", describeAdmission(streams));
    this.field("step", `${fmt(step.last_ms)} ms (avg ${fmt(step.avg_ms)}, batch ${step.last_batch_size})`);
    this.field("rtf", fmt(snapshot.rtf, 3));
    this.field("steps", String(step.num_steps));
    const model = snapshot.model || {};
    this.field("model", `${model.name || "?"} · ${model.chunk_ms || "?"} ms chunks · ${model.device || "?"}`);
    this.field("history", slots ? "fixed-size slot state (no paged blocks)"
      : describeHistory(model.num_left_chunks, model.chunk_ms));
    this.field("uptime", `${fmt(snapshot.uptime_s, 0)} s`);
    this.secondPass.update(snapshot.second_pass);
    if (snapshot.server) {
      const server = snapshot.server;
      this.field("connections", `${server.connections} / ${server.max_connections}`);
      this.field("replica", describeReplica(server, this.myReplica));
    }
    this.grid.setAttribute("aria-label", slots
      ? `Stream slots: ${used} of ${total} in use (no paged blocks)`
      : `Block pool: ${used} of ${total} blocks in use by ${streams.active} streams`);
    this.paintReasons(snapshot.finish_reasons || {});
    this.paintLegend(streams.list || [], slots ? null : pool.block_size_frames);
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
      const held = blockFrames === null ? `slot ${stream.slot}`
        : `${stream.num_blocks} blocks (${stream.num_blocks * (blockFrames || 0)} frames)`;
      label.textContent = `stream ${stream.stream_id}${mine}: ${held}, ${fmt(stream.audio_s)} s` +
        " audio, ";
      const lag = document.createElement("span");
      lag.className = stream.lag_s >= LATE_S ? "lag late" : "lag";
      lag.dataset.lagS = String(stream.lag_s);
      lag.dataset.stream = String(stream.stream_id);
      lag.title = "audio received and not decoded yet: how far behind its text is";
      lag.textContent = `lag ${fmt(stream.lag_s, 2)} s`;
      label.append(lag);
      item.append(swatch, label);
      this.legend.append(item);
    }
  }
}

/** The partials' lag histogram ({buckets_s, counts, sum_s}) as "mean, share over 1 s". */
/** "N more" streams admissible now, and what a step costs as admission prices it. */
function describeAdmission(streams) {
  const room = `${streams.admissible ?? "-"} more`;
  if (typeof streams.cost_per_audio_s !== "number") return `${room} (slots alone decide)`;
  return `${room} · a step ${fmt(1000 * (streams.cost_per_step_s ?? 0))} ms + ` +
    `${fmt(1000 * streams.cost_per_audio_s)} ms per second of audio`;
}

function describeLag(lag) {
  if (!lag || !lag.counts) return "-";
  const total = lag.counts.reduce((a, b) => a + b, 0);
  if (!total) return "no partials yet";
  const within = lag.buckets_s.indexOf(LATE_S);
  const late = within < 0 ? 0 : lag.counts.slice(within + 1).reduce((a, b) => a + b, 0);
  return `mean ${fmt((1000 * lag.sum_s) / total, 0)} ms over ${total} partials; ` +
    `${fmt((100 * late) / total, 1)}% more than ${LATE_S} s behind`;
}

/** "name", plus whether this tab's stream runs there, plus "draining (N s left)". */
function describeReplica(server, myReplica) {
  let text = server.replica || "this server";
  if (myReplica) {
    text += myReplica === server.replica ? " (your stream runs here)"
      : ` (your stream runs on ${myReplica})`;
  }
  if (server.draining) {
    const left = server.drain_seconds_left;
    text += ` · draining${left === null || left === undefined ? "" : ` (${fmt(left, 0)} s left)`}`;
  }
  return text;
}
