// API keys from the page's side. When the server has keys, the page asks for one once (kept
// in this tab's sessionStorage), trades it at POST /api/token for a short-lived token, and
// offers only that token to websockets, as the "openai-insecure-api-key.TOKEN" subprotocol
// (a page cannot set headers on a websocket). Without keys the server answers {token: null}.

const KEY_STORAGE = "oasr-api-key";
const KEY_SUBPROTOCOL = "openai-insecure-api-key.";
const MARGIN_S = 10; // a token this close to expiry is replaced first

let cached = null; // {token, expiresAt} or {token: null} when the server has no keys
let inflight = null; // one token request at a time (the mic and the stats socket share it)
let declined = false; // the user dismissed the key prompt: do not ask again in this tab

async function requestToken(key) {
  const headers = key ? { Authorization: `Bearer ${key}` } : {};
  const response = await fetch("/api/token", { method: "POST", headers });
  if (response.status === 401) return null;
  if (!response.ok) throw new Error(`token request failed: HTTP ${response.status}`);
  return response.json();
}

/** The websocket subprotocols that authenticate this page: [] when the server has no keys. */
export function socketProtocols() {
  if (!inflight) inflight = fetchProtocols().finally(() => { inflight = null; });
  return inflight;
}

async function fetchProtocols() {
  const now = Date.now() / 1000;
  if (cached && (cached.token === null || cached.expiresAt - MARGIN_S > now)) {
    return cached.token === null ? [] : [KEY_SUBPROTOCOL + cached.token];
  }
  let key = sessionStorage.getItem(KEY_STORAGE);
  let answer = await requestToken(key);
  if (answer === null) {
    if (declined) throw new Error("the server needs an API key (reload the page to enter one)");
    key = window.prompt("This oasr server needs an API key:");
    if (!key) {
      declined = true;
      throw new Error("the server needs an API key");
    }
    answer = await requestToken(key.trim());
    if (answer === null) throw new Error("the server rejected that API key");
    sessionStorage.setItem(KEY_STORAGE, key.trim());
  }
  cached = { token: answer.token, expiresAt: answer.expires_at };
  return cached.token === null ? [] : [KEY_SUBPROTOCOL + cached.token];
}
