// Microphone capture: getUserMedia with the browser's voice processing off, an AudioWorklet
// that posts ~100 ms frames of s16le at the AudioContext's real rate.

export const FRAME_MS = 100;

/** An error whose message is written for the user. */
export class MicError extends Error {}

/** Why the mic cannot be used on this page at all, or null if it may work. */
export function micUnavailableReason() {
  if (!window.isSecureContext) {
    return `The microphone needs a secure page: this page is ${location.origin}. ` +
      "Open it over https, or as http://localhost on the machine running the server. " +
      "The file button still works.";
  }
  if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
    return "This browser does not offer microphone capture (navigator.mediaDevices is missing).";
  }
  if (typeof AudioWorkletNode === "undefined") {
    return "This browser has no AudioWorklet support; use a current Chrome, Firefox or Safari.";
  }
  return null;
}

function explainGetUserMediaError(error) {
  switch (error && error.name) {
    case "NotAllowedError":
    case "SecurityError":
      return "Microphone access was denied. Allow it in the browser's site settings " +
        "(the icon left of the address) and press the mic button again.";
    case "NotFoundError":
    case "OverconstrainedError":
      return "No microphone was found. Plug one in, or use the file button.";
    case "NotReadableError":
    case "AbortError":
      return "The microphone is busy or failed to start (another app may hold it).";
    default:
      return `The microphone could not start: ${error && error.message ? error.message : error}`;
  }
}

/**
 * Start capturing.
 * @param {{onFrame: (pcm: ArrayBuffer) => void, onLevel?: (peak: number) => void}} handlers
 * @returns {Promise<{sampleRate: number, stop: () => Promise<void>}>} stop() flushes the last
 *   partial frame through onFrame, then releases the mic.
 */
export async function startMic({ onFrame, onLevel }) {
  const reason = micUnavailableReason();
  if (reason) throw new MicError(reason);
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({
      audio: {
        channelCount: 1,
        echoCancellation: false,
        noiseSuppression: false,
        autoGainControl: false,
      },
      video: false,
    });
  } catch (error) {
    throw new MicError(explainGetUserMediaError(error));
  }
  const context = new AudioContext();
  try {
    await context.audioWorklet.addModule(new URL("./capture-worklet.js", import.meta.url));
  } catch (error) {
    stream.getTracks().forEach((track) => track.stop());
    await context.close();
    throw new MicError(`The audio worklet failed to load: ${error.message}`);
  }
  const source = context.createMediaStreamSource(stream);
  const frameSamples = Math.round((context.sampleRate * FRAME_MS) / 1000);
  const node = new AudioWorkletNode(context, "oasr-capture", {
    numberOfInputs: 1,
    numberOfOutputs: 0,
    channelCount: 1,
    channelCountMode: "explicit",
    channelInterpretation: "speakers",
    processorOptions: { frameSamples },
  });
  let flushed = null;
  node.port.onmessage = (event) => {
    const message = event.data;
    if (message.type === "frame") {
      onFrame(message.pcm);
      if (onLevel) onLevel(message.peak);
    } else if (message.type === "flushed" && flushed) {
      flushed();
    }
  };
  source.connect(node);
  if (context.state === "suspended") await context.resume();

  async function stop() {
    const done = new Promise((resolve) => { flushed = resolve; });
    node.port.postMessage({ type: "flush" });
    await Promise.race([done, new Promise((resolve) => setTimeout(resolve, 500))]);
    source.disconnect();
    node.disconnect();
    stream.getTracks().forEach((track) => track.stop());
    await context.close();
  }

  return { sampleRate: context.sampleRate, stop };
}
