// Wires the page: mic and file sources -> /ws/asr -> transcript; /ws/stats -> pool panel.

import { AsrStream } from "./asr-socket.js";
import { socketProtocols } from "./auth.js";
import { decodeFile, FILE_SAMPLE_RATE, streamSamples } from "./file-source.js";
import { MicError, micUnavailableReason, startMic } from "./mic.js";
import { PoolPanel } from "./pool-panel.js";
import { connectStats } from "./stats-socket.js";
import { TranscriptView } from "./transcript.js";

const ui = {
  mic: document.getElementById("mic"),
  micLabel: document.querySelector("[data-mic-label]"),
  file: document.getElementById("file"),
  fileButton: document.getElementById("file-button"),
  stopFile: document.getElementById("stop-file"),
  clear: document.getElementById("clear"),
  hotwords: document.getElementById("hotwords"),
  status: document.getElementById("status"),
  meter: document.querySelector("[data-meter]"),
  connection: document.querySelector("[data-connection]"),
};
const transcript = new TranscriptView(document.getElementById("transcript"));
const panel = new PoolPanel(document.getElementById("pool"));

const FINISH_EXPLANATIONS = {
  length: "this stream reached the engine's per-stream length limit",
  timeout: "no audio arrived for too long, or the session reached its maximum length",
  abandoned: "the connection dropped and the page did not come back within the resume window",
  error: "the engine failed on this stream (the server log says why)",
};

// What is running now: null, or {kind: "mic"|"file", stream, stopSource, ending}.
let active = null;

function setStatus(text, kind = "info") {
  ui.status.textContent = text;
  ui.status.dataset.kind = kind;
}

function setBusy(kind) {
  const running = kind !== null;
  document.body.dataset.state = kind || "idle";
  ui.mic.setAttribute("aria-pressed", String(kind === "mic"));
  ui.micLabel.textContent = kind === "mic" ? "Stop mic" : "Start mic";
  ui.mic.disabled = running && kind !== "mic";
  ui.file.disabled = running;
  ui.fileButton.disabled = running;
  ui.stopFile.hidden = kind !== "file";
}

function finish(message, kind) {
  if (!active) return;
  const current = active;
  active = null;
  ui.meter.style.width = "0%";
  // level callbacks already queued by the capture worklet may land while the source stops
  current.stopSource().catch(() => {}).finally(() => {
    if (!active) ui.meter.style.width = "0%";
  });
  panel.setMyStream(null);
  setBusy(null);
  if (message) setStatus(message, kind);
}

/** The hotwords field's terms: comma-separated, empty ones dropped. */
function hotwordTerms() {
  return ui.hotwords.value.split(",").map((t) => t.trim()).filter(Boolean);
}

function describeHotwords(list) {
  return list && list.length ? `; hotwords: ${list.map((h) => h.phrase).join(", ")}` : "";
}

function openStream(sampleRate, label, activity, protocols) {
  transcript.beginRun(label);
  return new AsrStream({
    sampleRate,
    format: "s16le",
    protocols,
    getProtocols: socketProtocols,
    hotwords: hotwordTerms(),
    handlers: {
      onReady: (m) => {
        panel.setMyStream(m.stream_id, m.replica || null);
        const where = m.replica ? ` on replica ${m.replica}` : "";
        setStatus(`${activity}: stream ${m.stream_id}${where}, ${m.chunk_ms} ms chunks` +
          `${describeHotwords(m.hotwords)}.`, "live");
      },
      onHotwords: (m) => {
        const terms = m.hotwords.map((h) => h.phrase).join(", ");
        transcript.note(terms ? `hotwords from here on: ${terms}` : "no hotwords from here on");
      },
      onReconnecting: (r) => {
        setStatus(`Reconnecting: ${r.explanation}; resuming the stream (the server keeps it ` +
          `${r.windowS} s)…`, "warn");
      },
      onResumed: (m) => {
        setStatus(`${activity}: stream ${m.stream_id} resumed after a dropped connection ` +
          `(the server held ${(m.received_samples / sampleRate).toFixed(1)} s of audio).`, "live");
      },
      onPartial: (m) => transcript.partial(m),
      onFinal: (m) => transcript.final(m),
      onDone: (m) => {
        transcript.note(`done: ${m.finish_reason}, ${m.segments} segment(s)`);
        const why = m.message || FINISH_EXPLANATIONS[m.finish_reason];
        finish(`Finished (${m.finish_reason})${why ? `: ${why}` : ""}.`,
          m.finish_reason === "stop" ? "info" : "error");
      },
      onError: (m) => {
        if (m.code === "bad_hotwords" && active && !active.ending) {
          // refused mid-stream: the stream goes on with its hotwords; at start the server closes
          transcript.note(`Hotwords refused: ${m.message}`, "error");
          setStatus(`Hotwords refused: ${m.message}`, "error");
          return;
        }
        const text = m.code === "busy" || m.code === "draining"
          ? `The server is ${m.code} (${m.message}).`
          : `Server error (${m.code}): ${m.message}`;
        transcript.note(text, "error");
        finish(text, "error");
      },
      onClosed: (c) => {
        if (!c.clean && active) finish(`Stopped: ${c.explanation}.`, "error");
      },
    },
  });
}

async function startMicRun() {
  setBusy("mic");
  setStatus("Asking for the microphone…");
  let stream = null;
  try {
    const protocols = await socketProtocols();
    const mic = await startMic({
      onFrame: (pcm) => stream && stream.sendAudio(pcm),
      onLevel: (peak) => {
        if (!active || active.kind !== "mic" || active.stream !== stream) return;
        ui.meter.style.width = `${Math.min(100, peak * 140)}%`;
      },
    });
    stream = openStream(mic.sampleRate, `mic (${mic.sampleRate} Hz)`, "Listening", protocols);
    active = { kind: "mic", stream, stopSource: mic.stop, ending: false };
    setStatus(`Connecting (mic at ${mic.sampleRate} Hz)…`);
  } catch (error) {
    setBusy(null);
    setStatus(error instanceof MicError ? error.message : `Could not start: ${error.message ?? error}`,
      "error");
  }
}

async function stopMicRun() {
  if (!active || active.kind !== "mic" || active.ending) return;
  active.ending = true;
  ui.micLabel.textContent = "Finishing…";
  setStatus("Flushing the last audio; waiting for the final words…");
  await active.stopSource();
  active.stopSource = async () => {};
  active.stream.end();
}

async function startFileRun(file) {
  setBusy("file");
  setStatus(`Decoding ${file.name}…`);
  let samples;
  let protocols;
  try {
    protocols = await socketProtocols();
    samples = await decodeFile(file);
  } catch (error) {
    setBusy(null);
    setStatus(error.message, "error");
    return;
  }
  const controller = new AbortController();
  const seconds = (samples.length / FILE_SAMPLE_RATE).toFixed(1);
  const stream = openStream(FILE_SAMPLE_RATE, `${file.name} (${seconds} s)`,
    `Streaming ${file.name} at real-time pace`, protocols);
  active = { kind: "file", stream, stopSource: async () => controller.abort(), ending: false };
  setStatus(`Streaming ${file.name} at real-time pace…`, "live");
  await streamSamples(samples, {
    onFrame: (pcm) => stream.sendAudio(pcm),
    onProgress: (f) => { ui.meter.style.width = `${(100 * f).toFixed(0)}%`; },
    signal: controller.signal,
  });
  if (active && active.stream === stream) {
    active.ending = true;
    setStatus("File sent; waiting for the final words…");
  }
  stream.end();
}

ui.mic.addEventListener("click", () => {
  if (active && active.kind === "mic") stopMicRun();
  else if (!active) startMicRun();
});
ui.file.addEventListener("change", () => {
  const file = ui.file.files && ui.file.files[0];
  ui.file.value = "";
  if (file && !active) startFileRun(file);
});
ui.fileButton.addEventListener("click", () => ui.file.click());
ui.stopFile.addEventListener("click", () => {
  if (active && active.kind === "file") active.stopSource();
});
ui.clear.addEventListener("click", () => transcript.clear());
// Enter (or leaving the field) while streaming sends the terms as the stream's new hotwords
ui.hotwords.addEventListener("change", () => {
  if (active && !active.ending) active.stream.setHotwords(hotwordTerms());
});

connectStats({
  onSnapshot: (snapshot) => panel.update(snapshot),
  onState: (state, detail) => {
    ui.connection.textContent = state === "live" ? "connected" : `server: ${detail}`;
    ui.connection.dataset.state = state;
  },
});

const micReason = micUnavailableReason();
if (micReason) setStatus(micReason, "error");
setBusy(null);
