// A local audio file as a live source: decoded and resampled by the browser to 16 kHz mono,
// then sent as ~100 ms s16le frames at real-time pace, exactly like the microphone's.

import { FRAME_MS } from "./mic.js";

export const FILE_SAMPLE_RATE = 16000;

/**
 * Decode any format the browser can play into mono float samples at FILE_SAMPLE_RATE.
 * @param {File} file
 * @returns {Promise<Float32Array>}
 */
export async function decodeFile(file) {
  const bytes = await file.arrayBuffer();
  const context = new OfflineAudioContext(1, 1, FILE_SAMPLE_RATE);
  let buffer;
  try {
    buffer = await context.decodeAudioData(bytes);
  } catch (error) {
    throw new Error(`${file.name} is not an audio file this browser can decode`);
  }
  const mono = new Float32Array(buffer.length);
  for (let c = 0; c < buffer.numberOfChannels; c++) {
    const channel = buffer.getChannelData(c);
    for (let i = 0; i < mono.length; i++) mono[i] += channel[i] / buffer.numberOfChannels;
  }
  return mono;
}

function toS16le(samples) {
  const pcm = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i++) {
    const s = Math.max(-1, Math.min(1, samples[i]));
    pcm[i] = s < 0 ? s * 0x8000 : s * 0x7fff;
  }
  return pcm.buffer;
}

/**
 * Send samples frame by frame at real-time pace.
 * @param {Float32Array} samples mono at FILE_SAMPLE_RATE
 * @param {{onFrame: (pcm: ArrayBuffer) => void, onProgress?: (fraction: number) => void,
 *          signal?: AbortSignal}} options
 * @returns {Promise<boolean>} true when every frame was sent, false when aborted.
 */
export async function streamSamples(samples, { onFrame, onProgress, signal }) {
  const frameSamples = (FILE_SAMPLE_RATE * FRAME_MS) / 1000;
  const started = performance.now();
  for (let offset = 0, index = 0; offset < samples.length; offset += frameSamples, index++) {
    if (signal && signal.aborted) return false;
    const due = started + index * FRAME_MS;
    const wait = due - performance.now();
    if (wait > 0) await new Promise((resolve) => setTimeout(resolve, wait));
    if (signal && signal.aborted) return false;
    onFrame(toS16le(samples.subarray(offset, offset + frameSamples)));
    if (onProgress) onProgress(Math.min(1, (offset + frameSamples) / samples.length));
  }
  return true;
}
