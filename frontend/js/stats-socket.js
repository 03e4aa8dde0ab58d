// /ws/stats: the server pushes an engine snapshot a few times a second. Reconnects with
// backoff when the connection drops, and reports the connection state.

import { socketUrl } from "./asr-socket.js";
import { socketProtocols } from "./auth.js";

/**
 * @param {{onSnapshot: (s: object) => void, onState: (state: "live"|"lost", detail: string) => void}} handlers
 * @returns {{close: () => void}}
 */
export function connectStats({ onSnapshot, onState }) {
  let ws = null;
  let delayMs = 500;
  let stopped = false;
  let timer = null;

  function retry(why) {
    onState("lost", `${why}; retrying in ${(delayMs / 1000).toFixed(1)} s`);
    timer = setTimeout(open, delayMs);
    delayMs = Math.min(delayMs * 2, 10000);
  }

  async function open() {
    let protocols;
    try {
      protocols = await socketProtocols();
    } catch (error) {
      retry(error.message);
      return;
    }
    if (stopped) return;
    ws = new WebSocket(socketUrl("/ws/stats"), protocols);
    ws.onopen = () => { delayMs = 500; onState("live", ""); };
    ws.onmessage = (event) => {
      try {
        onSnapshot(JSON.parse(event.data));
      } catch {
        /* a malformed snapshot is skipped; the next one replaces it */
      }
    };
    ws.onclose = (event) => {
      if (stopped) return;
      const why = { 1013: "server busy", 1008: "API key refused" }[event.code] ?? "connection lost";
      retry(why);
    };
  }

  open();
  return {
    close() {
      stopped = true;
      clearTimeout(timer);
      if (ws) ws.close();
    },
  };
}
