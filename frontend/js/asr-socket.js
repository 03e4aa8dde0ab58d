// The /ws/asr protocol from the browser's side: start, binary PCM frames, end; the server
// answers ready, partial, final, done or error, then closes. When the socket drops before the
// end (no done, no error: a Wi-Fi blip, a proxy cut), the stream reconnects by itself within
// the server's resume window and resumes: the server says how much audio it holds and the rest
// is sent again from the audio kept here.

/** The websocket URL of an endpoint on the server that served this page. */
export function socketUrl(path) {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  return `${scheme}://${location.host}${path}`;
}

const CLOSE_MEANINGS = {
  1001: "the server is shutting down",
  1003: "the server cannot use this audio",
  1006: "the connection dropped",
  1008: "the server refused a message",
  1009: "a message was too large",
  1011: "the server hit an internal error",
  1012: "the server is restarting; try again in a moment",
  1013: "the server is busy; try again in a moment",
};
// A drop with these codes is not resumed: closed on purpose, or a server going away with its
// streams.
const NOT_RESUMED = new Set([1000, 1001, 1012]);
const RETRY_MS = [250, 500, 1000, 2000]; // between resume attempts (then every 2 s)
const KEPT_EXTRA_S = 10; // audio kept for a resume beyond the server's resume window
const END = JSON.stringify({ type: "end" });

/**
 * One recognition stream over one websocket.
 *
 * handlers: onReady({stream_id, sample_rate, chunk_ms, hotwords}), onPartial({segment, text,
 * words}), onFinal({segment, text, start, end, reason, words}), onHotwords({hotwords}),
 * onDone({finish_reason, segments}), onError({code, message}),
 * onClosed({code, reason, clean, explanation}), onReconnecting({explanation, windowS}),
 * onResumed({stream_id, received_samples}). hotwords: terms (strings) sent with start;
 * getProtocols: an async function giving the subprotocols of a reconnection (a fresh token).
 */
export class AsrStream {
  constructor({ sampleRate, format = "s16le", protocols = [], hotwords = [], handlers,
    getProtocols = null }) {
    this.handlers = handlers;
    this.isDone = false;
    this.lastError = null;
    this.pending = []; // messages for a socket not open yet (or not resumed yet)
    this.sampleRate = sampleRate;
    this.bytesPerSample = format === "f32le" ? 4 : 2;
    this.getProtocols = getProtocols;
    this.resumeToken = null; // the latest ready's: resumes the stream after a drop
    this.resumeWindowS = 0;
    this.lastFinal = -1; // the segment of the last final received
    this.kept = []; // [{start, pcm}]: the audio sent lately, start in samples
    this.numSamples = 0; // samples handed to sendAudio so far
    this.ended = false; // "end" went out on an open socket: the stream is not resumed then
    this.stopped = false;
    this.reconnecting = false;
    this.droppedAt = 0;
    this.attempt = 0;
    this.connect(protocols, (ws) => {
      const start = { type: "start", sample_rate: sampleRate, format };
      if (hotwords.length) start.hotwords = hotwords;
      ws.send(JSON.stringify(start));
      this.flushPending();
    });
  }

  /** Open a socket; `first(ws)` sends its first messages once it is open. */
  connect(protocols, first) {
    const ws = new WebSocket(socketUrl("/ws/asr"), protocols);
    ws.binaryType = "arraybuffer";
    ws.onopen = () => first(ws);
    ws.onmessage = (event) => { if (ws === this.ws) this.dispatch(event.data); };
    ws.onclose = (event) => { if (ws === this.ws) this.closed(event); };
    this.ws = ws;
  }

  get isOpen() {
    return this.reconnecting || this.ws.readyState === WebSocket.OPEN ||
      this.ws.readyState === WebSocket.CONNECTING;
  }

  send(item) {
    if (this.reconnecting || this.ws.readyState === WebSocket.CONNECTING) {
      this.pending.push(item);
    } else if (this.ws.readyState === WebSocket.OPEN) {
      this.ws.send(item);
      if (item === END) this.ended = true;
    }
  }

  flushPending() {
    const pending = this.pending;
    this.pending = [];
    for (const item of pending) this.send(item);
  }

  /** Send one frame of PCM (ArrayBuffer), kept for a resume; dropped once closed for good. */
  sendAudio(pcm) {
    this.keep(pcm);
    if (!this.reconnecting) this.send(pcm); // else sent from what is kept once resumed
  }

  keep(pcm) {
    this.kept.push({ start: this.numSamples, pcm });
    this.numSamples += pcm.byteLength / this.bytesPerSample;
    const keepSamples = (this.resumeWindowS + KEPT_EXTRA_S) * this.sampleRate;
    while (!this.reconnecting && this.kept.length > 1 &&
      this.kept[1].start < this.numSamples - keepSamples) this.kept.shift();
  }

  /** Replace the stream's hotwords (strings) from its next chunk on; the server echoes them. */
  setHotwords(hotwords) {
    this.send(JSON.stringify({ type: "hotwords", hotwords }));
  }

  /** Tell the server that all audio was sent; the final segment and done follow. */
  end() {
    this.send(END);
  }

  /** Drop the stream without waiting for the transcript. */
  abort() {
    this.stopped = true;
    this.reconnecting = false;
    if (this.ws.readyState === WebSocket.OPEN || this.ws.readyState === WebSocket.CONNECTING) {
      this.ws.close(1000, "client stopped");
    }
  }

  dispatch(data) {
    if (typeof data !== "string") return;
    let message;
    try {
      message = JSON.parse(data);
    } catch {
      return;
    }
    const h = this.handlers;
    switch (message.type) {
      case "ready":
        this.resumeToken = message.resume_token || null;
        this.resumeWindowS = message.resume_window_s || 0;
        if (message.resumed) {
          this.resumed(message.received_samples);
          if (h.onResumed) h.onResumed(message);
        } else if (h.onReady) {
          h.onReady(message);
        }
        break;
      case "partial": h.onPartial && h.onPartial(message); break;
      case "final":
        this.lastFinal = Math.max(this.lastFinal, message.segment);
        h.onFinal && h.onFinal(message);
        break;
      case "hotwords": h.onHotwords && h.onHotwords(message); break;
      case "done": this.isDone = true; h.onDone && h.onDone(message); break;
      case "error": this.lastError = message; h.onError && h.onError(message); break;
      default: break;
    }
  }

  /** The server holds the stream's first `from` samples: send the rest, then what waited. */
  resumed(from) {
    this.reconnecting = false;
    for (const { start, pcm } of this.kept) {
      const length = pcm.byteLength / this.bytesPerSample;
      if (start + length <= from) continue;
      const skip = Math.max(0, from - start) * this.bytesPerSample;
      this.ws.send(skip ? pcm.slice(skip) : pcm);
    }
    this.flushPending();
  }

  /** The socket dropped: try to resume until the server's resume window has passed. */
  reconnect(explanation) {
    if (!this.reconnecting) {
      this.reconnecting = true;
      this.droppedAt = performance.now();
      this.attempt = 0;
      if (this.handlers.onReconnecting) {
        this.handlers.onReconnecting({ explanation, windowS: this.resumeWindowS });
      }
    }
    const delay = RETRY_MS[Math.min(this.attempt, RETRY_MS.length - 1)];
    if ((performance.now() - this.droppedAt + delay) / 1000 > this.resumeWindowS) {
      this.reconnecting = false;
      this.handlers.onClosed && this.handlers.onClosed({
        code: 1006, reason: "", clean: false,
        explanation: `${explanation}, and the stream could not be resumed within ` +
          `${this.resumeWindowS} s`,
      });
      return;
    }
    this.attempt += 1;
    setTimeout(() => this.resume(), delay);
  }

  async resume() {
    if (this.stopped || !this.reconnecting) return;
    let protocols = [];
    try {
      protocols = this.getProtocols ? await this.getProtocols() : [];
    } catch {
      this.reconnect(CLOSE_MEANINGS[1006]);
      return;
    }
    this.connect(protocols, (ws) => ws.send(JSON.stringify(
      { type: "start", resume: this.resumeToken, last_final: this.lastFinal })));
  }

  closed(event) {
    const resumable = !this.isDone && !this.lastError && !this.stopped && !this.ended &&
      this.resumeToken !== null && !NOT_RESUMED.has(event.code);
    if (resumable) {
      this.reconnect(CLOSE_MEANINGS[event.code] || `the connection closed (code ${event.code})`);
      return;
    }
    this.reconnecting = false;
    const clean = this.isDone || (event.code === 1000 && !this.lastError);
    const explanation = clean ? "" : (CLOSE_MEANINGS[event.code] ||
      `the connection closed (code ${event.code}${event.reason ? `: ${event.reason}` : ""})`);
    if (this.handlers.onClosed) {
      this.handlers.onClosed({ code: event.code, reason: event.reason, clean, explanation });
    }
  }
}
