// The /ws/asr protocol from the browser's side: start, binary PCM frames, end; the server
// answers ready, partial, final, done or error, then closes.

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

/**
 * One recognition stream over one websocket.
 *
 * handlers: onReady({stream_id, sample_rate, chunk_ms, hotwords}), onPartial({segment, text,
 * words}), onFinal({segment, text, start, end, reason, words}), onHotwords({hotwords}),
 * onDone({finish_reason, segments}), onError({code, message}),
 * onClosed({code, reason, clean, explanation}). hotwords: terms (strings) sent with start.
 */
export class AsrStream {
  constructor({ sampleRate, format = "s16le", protocols = [], hotwords = [], handlers }) {
    this.handlers = handlers;
    this.isDone = false;
    this.lastError = null;
    this.pending = [];
    this.ws = new WebSocket(socketUrl("/ws/asr"), protocols);
    this.ws.binaryType = "arraybuffer";
    this.ws.onopen = () => {
      const start = { type: "start", sample_rate: sampleRate, format };
      if (hotwords.length) start.hotwords = hotwords;
      this.ws.send(JSON.stringify(start));
      for (const item of this.pending) this.ws.send(item);
      this.pending = [];
    };
    this.ws.onmessage = (event) => this.dispatch(event.data);
    this.ws.onclose = (event) => this.closed(event);
  }

  get isOpen() {
    return this.ws.readyState === WebSocket.OPEN || this.ws.readyState === WebSocket.CONNECTING;
  }

  send(item) {
    if (this.ws.readyState === WebSocket.CONNECTING) this.pending.push(item);
    else if (this.ws.readyState === WebSocket.OPEN) this.ws.send(item);
  }

  /** Send one frame of PCM (ArrayBuffer). Dropped silently once the socket is closing. */
  sendAudio(pcm) {
    this.send(pcm);
  }

  /** Replace the stream's hotwords (strings) from its next chunk on; the server echoes them. */
  setHotwords(hotwords) {
    this.send(JSON.stringify({ type: "hotwords", hotwords }));
  }

  /** Tell the server that all audio was sent; the final segment and done follow. */
  end() {
    this.send(JSON.stringify({ type: "end" }));
  }

  /** Drop the stream without waiting for the transcript. */
  abort() {
    if (this.isOpen) this.ws.close(1000, "client stopped");
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
      case "ready": h.onReady && h.onReady(message); break;
      case "partial": h.onPartial && h.onPartial(message); break;
      case "final": h.onFinal && h.onFinal(message); break;
      case "hotwords": h.onHotwords && h.onHotwords(message); break;
      case "done": this.isDone = true; h.onDone && h.onDone(message); break;
      case "error": this.lastError = message; h.onError && h.onError(message); break;
      default: break;
    }
  }

  closed(event) {
    const clean = this.isDone || (event.code === 1000 && !this.lastError);
    const explanation = clean ? "" : (CLOSE_MEANINGS[event.code] ||
      `the connection closed (code ${event.code}${event.reason ? `: ${event.reason}` : ""})`);
    if (this.handlers.onClosed) {
      this.handlers.onClosed({ code: event.code, reason: event.reason, clean, explanation });
    }
  }
}
