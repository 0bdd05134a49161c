// Microphone -> mono pcm16 at 24 kHz (the Realtime API's input format), posted to the page in ~100 ms chunks.
//
// The page asks for an AudioContext at 24 kHz, in which case samples pass straight through. A browser that
// runs the context at another rate (Firefox refuses to connect a microphone to a context whose rate differs
// from the device's) gets a windowed-sinc resampler here, low-passed below the smaller Nyquist rate so that
// 48 -> 24 kHz does not alias.
//
// processorOptions: {targetRate: 24000, chunkMs: 100}
// port messages out: {pcm: ArrayBuffer (Int16 little-endian), rms: float}; in: "flush" (send what is buffered).

const ZEROS = 8; // zero crossings of the sinc kernel on each side

class PcmEncoder extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const o = (options && options.processorOptions) || {};
    this.outRate = o.targetRate || 24000;
    this.chunk = Math.max(1, Math.round((this.outRate * (o.chunkMs || 100)) / 1000));
    this.out = new Int16Array(this.chunk);
    this.n = 0; // samples in this.out
    this.sumSq = 0;
    this.ratio = sampleRate / this.outRate; // input samples per output sample (`sampleRate` is the context's)
    this.passthrough = Math.abs(this.ratio - 1) < 1e-9;
    // cutoff in cycles per input sample, a little under the lower of the two Nyquist rates
    this.fc = 0.5 * 0.94 * Math.min(1, 1 / this.ratio);
    this.half = Math.ceil(ZEROS / (2 * this.fc)); // kernel half width, input samples
    this.hist = new Float32Array(0); // input not yet fully used
    this.t = this.half; // position of the next output sample within hist (input samples)
    this.port.onmessage = (e) => {
      if (e.data === "flush") this.flush();
    };
  }

  kernel(d) {
    // windowed sinc (Blackman) at distance d input samples, unit DC gain up to discretization
    if (Math.abs(d) >= this.half) return 0;
    const x = 2 * this.fc * d;
    const s = x === 0 ? 1 : Math.sin(Math.PI * x) / (Math.PI * x);
    const w = 0.42 + 0.5 * Math.cos((Math.PI * d) / this.half) + 0.08 * Math.cos((2 * Math.PI * d) / this.half);
    return 2 * this.fc * s * w;
  }

  push(v) {
    const c = v > 1 ? 1 : v < -1 ? -1 : v;
    this.out[this.n++] = c < 0 ? c * 0x8000 : c * 0x7fff;
    this.sumSq += c * c;
    if (this.n === this.chunk) this.flush();
  }

  flush() {
    if (this.n === 0) return;
    const pcm = this.out.slice(0, this.n);
    const rms = Math.sqrt(this.sumSq / this.n);
    this.n = 0;
    this.sumSq = 0;
    this.port.postMessage({ pcm: pcm.buffer, rms }, [pcm.buffer]);
  }

  process(inputs) {
    const input = inputs[0];
    if (!input || input.length === 0 || input[0].length === 0) return true; // no source connected (yet)
    // downmix to mono
    const len = input[0].length;
    let mono = input[0];
    if (input.length > 1) {
      mono = new Float32Array(len);
      for (const ch of input) for (let i = 0; i < len; i++) mono[i] += ch[i] / input.length;
    }
    if (this.passthrough) {
      for (let i = 0; i < len; i++) this.push(mono[i]);
      return true;
    }
    const h = new Float32Array(this.hist.length + len);
    h.set(this.hist);
    h.set(mono, this.hist.length);
    // each output sample needs `half` input samples on both sides of its position t
    while (this.t + this.half < h.length) {
      const c = Math.floor(this.t);
      let acc = 0;
      for (let k = c - this.half + 1; k <= c + this.half; k++) acc += h[k] * this.kernel(this.t - k);
      this.push(acc);
      this.t += this.ratio;
    }
    const keep = Math.floor(this.t) - this.half; // samples before this are no longer needed
    this.hist = h.slice(keep);
    this.t -= keep;
    return true;
  }
}

registerProcessor("pcm16-encoder", PcmEncoder);
