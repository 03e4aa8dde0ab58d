// AudioWorklet processor: mono capture at the context's own rate, cut into fixed frames of
// 16-bit little-endian PCM and posted to the main thread (transferring the buffer).
//
// processorOptions.frameSamples: samples per posted frame (~100 ms at the context rate).
// port messages in:  {type: "flush"} -> post the partial frame, then {type: "flushed"}.
// port messages out: {type: "frame", pcm: ArrayBuffer, peak: number} | {type: "flushed"}.

class CaptureProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.frameSamples = options.processorOptions.frameSamples;
    this.frame = new Int16Array(this.frameSamples);
    this.fill = 0;
    this.peak = 0;
    this.flushing = false;
    this.port.onmessage = (event) => {
      if (event.data && event.data.type === "flush") this.flushing = true;
    };
  }

  post(length) {
    const pcm = this.frame.slice(0, length).buffer;
    this.port.postMessage({ type: "frame", pcm, peak: this.peak }, [pcm]);
    this.fill = 0;
    this.peak = 0;
  }

  process(inputs) {
    const channels = inputs[0];
    if (channels && channels.length > 0) {
      const n = channels[0].length;
      for (let i = 0; i < n; i++) {
        let sample = 0;
        for (let c = 0; c < channels.length; c++) sample += channels[c][i];
        sample /= channels.length;
        const clipped = Math.max(-1, Math.min(1, sample));
        this.peak = Math.max(this.peak, Math.abs(clipped));
        this.frame[this.fill++] = clipped < 0 ? clipped * 0x8000 : clipped * 0x7fff;
        if (this.fill === this.frameSamples) this.post(this.fill);
      }
    }
    if (this.flushing) {
      if (this.fill > 0) this.post(this.fill);
      this.port.postMessage({ type: "flushed" });
      this.flushing = false;
      return false;
    }
    return true;
  }
}

registerProcessor("oasr-capture", CaptureProcessor);
