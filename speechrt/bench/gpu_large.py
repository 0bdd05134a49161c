"""`bench gpu`'s 1B-class checks: whole decode steps and passes at sizes where bytes and FLOPs, not launches, set the
time, with random weights written here (speed does not depend on the values).

- lm-1b: the Llama-3.2-1B shape's decode step at batch 1 (512 cached positions, bf16): ours (the triton backend's
  runner: its decode step replayed from a CUDA graph, in the fused layer kernels) against the same step in plain
  torch with a static cache (gpt-fast's recipe, static_llama.py), eager and under torch.compile(mode="max-autotune"),
  each with the fraction of the measured copy bandwidth its bytes (weights once, the cache it reads) take;
- asr-turbo: the Whisper large-v3-turbo shape (d 1280, 32 encoder / 4 decoder layers, 20 heads, 128 mel bins,
  vocabulary 51866, float16): the 30-s encoder pass, ours (Triton kernels) against SDPA + cuBLAS eager (the torch
  backend's kernels), with the fraction of the measured matrix throughput its FLOPs take, and ours again with its
  products of VENDOR_ROWS rows or more on torch's matmul (cuBLAS: triton_matmul.VENDOR_GEMM_MIN_ROWS, variant
  "speechrt-vendor-gemm"), which decides whether the encoder's GEMMs go there; and the decode step at batch 1, ours
  from the graph slot against the torch backend's eager step, with its fraction of the bandwidth.

`run_lm()` and `run_asr()` run anywhere the kernels run (the tests: tiny configs on the CPU in the Triton interpreter,
uncaptured, the static step uncompiled); only the check_* functions want a GPU."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

from speechrt.bench.gpu_fused import CONTEXT, SHAPES, random_weights, step_bytes, with_setting
from speechrt.bench.record import Record, Repeats, Results
from speechrt.models.whisper import WhisperConfig

TURBO = WhisperConfig(
    n_mels=128,
    n_audio_ctx=1500,
    n_audio_state=1280,
    n_audio_head=20,
    n_audio_layer=32,
    n_vocab=51866,
    n_text_ctx=448,
    n_text_state=1280,
    n_text_head=20,
    n_text_layer=4,
)
ASR_POSITION = 224  # where the timed decode step writes (half the decoder's context cached before it)
# the vendor-GEMM variants (asr-turbo's encoder pass, lm-prefill's prompts): products of this many rows or more go to
# torch's matmul: the encoder's 1500 rows and prompts of 128+ tokens do, a decode step's few rows never
VENDOR_ROWS = 64
LM_VARIANTS = ("speechrt", "torch-static", "torch-compile-static")


def on_vendor_gemm(fn):
    """`fn` run, each call, with products of VENDOR_ROWS rows or more on torch's matmul
    (triton_matmul.VENDOR_GEMM_MIN_ROWS): the vendor-GEMM variants' setting (a graph captured from it holds those)."""
    from speechrt.kernels import triton_matmul

    return with_setting(fn, triton_matmul, "VENDOR_GEMM_MIN_ROWS", VENDOR_ROWS)


def _record(out, device, model, engine, backend, precision, workload, metric, ts, peer, params) -> Record:
    r = Record(
        family="gpu",
        model=model,
        engine=engine,
        backend=backend,
        precision=precision,
        device=str(device),
        workload=workload,
        metric=metric,
        unit="us",
        value=statistics.median(ts) * 1e6,
        better="lower",
        repeats=Repeats.of(t * 1e6 for t in ts),
        peer=peer,
        params=params,
    )
    out.records.append(r)
    return r


def lm_steps(cfg, device, dtype, context: int, capture: bool, compile: bool):
    """variant -> a decode-step callable at batch 1 with `context` cached positions (random weights and cache, the
    same in every variant), and the static model (its eager logits are the cross-check)."""
    import torch

    from speechrt.backends.triton.lm import TritonLMRunner
    from speechrt.bench.static_llama import StaticLlama, compiled_step, decode_one_token, gpt_fast_inductor

    fmt = str(dtype).removeprefix("torch.")
    w = random_weights(cfg, device, dtype)
    lm_file = SimpleNamespace(config=cfg, weights=w, tokenizer=None, chat_template=None, q4=None)
    runner = TritonLMRunner(lm_file, device, fmt, "triton", capture=capture)
    static = StaticLlama(cfg, w, device, dtype)
    del w, lm_file
    cache = runner.new_cache(1, context + 1)
    g = torch.Generator(device=device).manual_seed(1)
    cache.k.normal_(generator=g), cache.v.normal_(generator=g)
    static.setup_caches(1, context + 1)
    for i, layer in enumerate(static.layers):
        layer.cache.k.copy_(cache.k[i]), layer.cache.v.copy_(cache.v[i])
    tok = torch.tensor([7], device=device)
    pos = torch.tensor([context], device=device)

    def ours():
        cache.lengths[0] = context  # every call steps the same position
        return runner.decode_step(cache, [0], tok)

    fast = compiled_step(compile)

    def compiled():
        if not warm:  # compiles, autotunes, records its CUDA graphs
            with gpt_fast_inductor():
                for _ in range(3):
                    fast(static, tok, pos)
            warm.append(True)
        return fast(static, tok, pos)[1]

    warm = []
    steps = {
        "speechrt": ours,
        "torch-static": lambda: decode_one_token(static, tok, pos)[1],
        "torch-compile-static": compiled,
    }
    return steps, runner


def run_lm(
    device, cfg, out: Results, timer, bandwidth_gbps: float, context=CONTEXT, capture=True, compile=True, dtype=None
):
    """Time the three variants of the decode step (records in `out`) -> (problems, notes): ours' logits against the
    static model's eager ones beyond bf16 rounding is a problem; a torch.compile that fails is a note (the peer could
    not run), as is a runner whose steps did not run fused."""
    import torch

    dtype = dtype or torch.bfloat16
    bad, notes = [], []
    with torch.inference_mode():
        steps, runner = lm_steps(cfg, device, dtype, context, capture, compile)
        if runner.fused_why:
            notes.append(f"our steps ran unfused: {runner.fused_why}")
        want = steps["torch-static"]().float()
        got = steps["speechrt"]().float()
        err = ((got - want).abs().amax() / want.abs().amax().clamp_min(1e-30)).item()
        if not err <= 5e-2:
            bad.append(f"our step's logits {err:.3g} (relative) from the static model's")
        nbytes = step_bytes(cfg, 1, context)
        prec, work = (
            str(dtype).removeprefix("torch."),
            f"decode step, batch 1, {context} cached positions, random weights",
        )
        for v, fn in steps.items():
            try:
                for _ in range(3):  # Triton compiles, graphs are captured
                    fn()
                ts = timer(fn)
            except Exception as e:  # the peer could not run here: said, not fatal
                notes.append(f"{v} did not run: {type(e).__name__}: {str(e)[:300]}")
                continue
            _record(
                out,
                device,
                "llama-3.2-1b" if cfg == SHAPES["llama-3.2-1b"] else "llama-shape",
                "speechrt" if v == "speechrt" else "torch",
                "triton graphs fused" if v == "speechrt" else ("inductor" if v == "torch-compile-static" else "torch"),
                prec,
                work,
                "decode_step_us",
                ts,
                "" if v == "speechrt" else "speechrt",
                {
                    "variant": v,
                    "bytes": nbytes,
                    "fraction_of_bandwidth": nbytes / statistics.median(ts) / (bandwidth_gbps * 1e9)
                    if bandwidth_gbps
                    else 0.0,
                    "vs_static_rel_err": err,
                },
            )
    return bad, notes


def check_lm_1b(dev, out: Results, cfg=None, peak=None, clock=None, **plan):
    """`cfg` (default the Llama-3.2-1B shape), `peak` (default measured here), `clock` (default roofline.timer) and
    run_lm's `plan` (context, capture, compile, dtype): what the tests change to run the check on the CPU."""
    import torch

    from speechrt.bench.roofline import probe, timer

    bw = (peak or probe(dev, torch.bfloat16)).bandwidth_gbps
    n0 = len(out.records)
    bad, notes = run_lm(dev, cfg or SHAPES["llama-3.2-1b"], out, clock or timer(dev), bw, **plan)
    by = {r.params["variant"]: r for r in out.records[n0:]}
    parts = [f"copy {bw:.0f} GB/s"]
    ours = by.get("speechrt")
    for v, r in by.items():
        ratio = f", ours {r.value / ours.value:.2f}x" if ours and r is not ours else ""
        parts.append(f"{v} {r.value:.0f} us ({r.params['fraction_of_bandwidth']:.0%} of bw){ratio}")
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return ("fail" if bad or not ours else "pass"), "; ".join(bad + parts + notes)


def random_whisper(cfg: WhisperConfig, device, dtype, seed: int = 0):
    """models.whisper_loaders.WhisperWeights of a model of `cfg` with random values drawn on `device`: matrices with
    a 1/sqrt(fan-in) spread, norms near 1, biases small."""
    import torch

    from speechrt import kernels
    from speechrt.models.whisper import Whisper
    from speechrt.models.whisper_loaders import WhisperWeights

    with torch.device("meta"):
        shapes = {k: v.shape for k, v in Whisper(cfg, kernels.select("torch", "cpu")).state_dict().items()}
    g = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for k, s in shapes.items():
        if k == "encoder.positional_embedding":  # computed, not stored
            continue
        t = torch.randn(s, generator=g, device=device, dtype=torch.float32)
        if len(s) >= 2:
            t *= (t[0].numel()) ** -0.5
        elif "_ln" in k or k.endswith("ln.weight") or k.endswith("ln_post.weight"):
            t = (1 + 0.1 * t) if k.endswith("weight") else 0.02 * t
        else:
            t *= 0.02
        state[k] = t.to(dtype)
    return WhisperWeights(cfg, state, None)


def encoder_flops(cfg: WhisperConfig) -> float:
    """FLOPs of one whole-window encoder pass: the two convolutions, then per layer the projections (q, k, v, out:
    4 d^2 a position), the MLP (2 x d x ffn) and attention (QK^T and PV: 4 T^2 d)."""
    d, T, ffn = cfg.n_audio_state, cfg.n_audio_ctx, cfg.n_audio_ffn or 4 * cfg.n_audio_state
    conv = 2 * (2 * T) * cfg.n_mels * 3 * d + 2 * T * d * 3 * d
    layer = 2 * T * (4 * d * d + 2 * d * ffn) + 4 * T * T * d
    return conv + cfg.n_audio_layer * layer


def decoder_step_bytes(cfg: WhisperConfig, position: int, elt: int = 2) -> int:
    """Bytes a batch-1 decoder step reads at least: per layer the self-attention (4 d^2), cross-attention query and
    output (2 d^2) and MLP (2 d ffn) weights, the window's cross keys and values, the self cache to the position;
    the token embedding twice read once (the tied vocabulary projection)."""
    d, ffn = cfg.n_text_state, cfg.n_text_ffn or 4 * cfg.n_text_state
    layer = 6 * d * d + 2 * d * ffn + 2 * cfg.n_audio_ctx * d + 2 * (position + 1) * d
    return elt * (cfg.n_text_layer * layer + cfg.n_vocab * d)


def run_asr(device, cfg: WhisperConfig, out: Results, timer, peak, position=ASR_POSITION, capture=True, dtype=None):
    """Time ours (Triton kernels; decode steps from the graph slot) and the torch backend's eager encoder pass and
    decode step (records in `out`) -> problems: ours' encoder states or step logits beyond float16 rounding of
    torch's. `peak`: roofline.Peak (copy GB/s, matmul TFLOP/s) for the fractions."""
    import torch

    from speechrt.backends.torch.asr import TorchASRRunner
    from speechrt.backends.triton.asr import TritonASRRunner

    dtype = dtype or torch.float16
    w = random_whisper(cfg, device, dtype)
    runners = {
        "speechrt": TritonASRRunner(w, device, dtype, capture=capture),
        "torch": TorchASRRunner(w, device, dtype),
    }
    del w
    g = torch.Generator(device=device).manual_seed(2)
    mel = torch.randn((1, cfg.n_mels, 2 * cfg.n_audio_ctx), generator=g, device=device).to(dtype)
    flops, nbytes, bad = encoder_flops(cfg), decoder_step_bytes(cfg, position), []
    prec, name = str(dtype).removeprefix("torch."), "whisper-large-v3-turbo" if cfg == TURBO else "whisper-shape"
    got = {}
    with torch.inference_mode():
        for v, r in runners.items():
            enc = r.encode(mel)
            state = r.start(enc, 1, cfg.n_text_ctx)
            r.decode_step(state, torch.tensor([[1, 2, 3]], device=device))  # a prompt, as a window starts
            tok = torch.tensor([[440 % cfg.n_vocab]], device=device)

            def step(r=r, state=state, tok=tok, at=position):
                state.offset = at  # every call steps the same position
                return r.decode_step(state, tok)

            # compared right after the prompt (the positions between hold what each path left there: padding in ours)
            got[v] = (enc.states.float(), step(at=3).float())
            ts = timer(lambda r=r: r.encode(mel))
            common = dict(
                engine="speechrt" if v == "speechrt" else "torch", backend="triton" if v == "speechrt" else "torch"
            )
            peer = "" if v == "speechrt" else "speechrt"
            _record(
                out,
                device,
                name,
                common["engine"],
                common["backend"],
                prec,
                "30-s encoder pass, batch 1, random weights",
                "encoder_us",
                ts,
                peer,
                {
                    "variant": v,
                    "flops": flops,
                    "fraction_of_matmul": flops / statistics.median(ts) / (peak.matmul_tflops * 1e12)
                    if peak.matmul_tflops
                    else 0.0,
                },
            )
            ts = timer(step)
            backend = "triton graphs" if v == "speechrt" and capture else common["backend"]
            _record(
                out,
                device,
                name,
                common["engine"],
                backend,
                prec,
                f"decode step, batch 1, position {position}, random weights",
                "decode_step_us",
                ts,
                peer,
                {
                    "variant": v,
                    "bytes": nbytes,
                    "fraction_of_bandwidth": nbytes / statistics.median(ts) / (peak.bandwidth_gbps * 1e9)
                    if peak.bandwidth_gbps
                    else 0.0,
                },
            )
    encode = on_vendor_gemm(lambda r=runners["speechrt"]: r.encode(mel))  # its GEMMs on the vendor's library
    with torch.inference_mode():
        got["speechrt-vendor-gemm"] = (encode().states.float(),)
        ts = timer(encode)
    params = {"variant": "speechrt-vendor-gemm", "flops": flops, "vendor_gemm_min_rows": VENDOR_ROWS}
    params["fraction_of_matmul"] = (
        flops / statistics.median(ts) / (peak.matmul_tflops * 1e12) if peak.matmul_tflops else 0.0
    )
    _record(
        out,
        device,
        name,
        "speechrt",
        "triton",
        prec,
        "30-s encoder pass, batch 1, random weights",
        "encoder_us",
        ts,
        "speechrt",
        params,
    )
    for v, i, what in (
        ("speechrt", 0, "encoder states"),
        ("speechrt", 1, "decode step logits"),
        ("speechrt-vendor-gemm", 0, "encoder states with the vendor's GEMMs"),
    ):
        a, b = got[v][i], got["torch"][i]
        err = ((a - b).abs().amax() / b.abs().amax().clamp_min(1e-30)).item()
        if not err <= 5e-2:
            bad.append(f"our {what} {err:.3g} (relative) from torch's")
    return bad


def check_asr_turbo(dev, out: Results, cfg=None, peak=None, clock=None, **plan):
    """`cfg` (default the turbo shape), `peak` (default measured here), `clock` (default roofline.timer) and run_asr's
    `plan` (position, capture, dtype): what the tests change to run the check on the CPU."""
    import torch

    from speechrt.bench.roofline import probe, timer

    peak = peak or probe(dev, torch.float16)
    n0 = len(out.records)
    bad = run_asr(dev, cfg or TURBO, out, clock or timer(dev), peak, **plan)
    by = {(r.metric, r.params["variant"]): r for r in out.records[n0:]}
    parts = [f"copy {peak.bandwidth_gbps:.0f} GB/s, matmul {peak.matmul_tflops:.0f} TFLOP/s"]
    for m, what, frac in (
        ("encoder_us", "30-s encoder", "fraction_of_matmul"),
        ("decode_step_us", "decode step", "fraction_of_bandwidth"),
    ):
        o, t = by[(m, "speechrt")], by[(m, "torch")]
        parts.append(
            f"{what}: ours {o.value:.0f} us ({o.params[frac]:.0%} of roof), torch eager {t.value:.0f} us: "
            f"{t.value / o.value:.2f}x"
        )
        if (m, "speechrt-vendor-gemm") in by:
            vg = by[(m, "speechrt-vendor-gemm")]
            parts[-1] += f"; ours with the vendor's GEMMs {vg.value:.0f} us: {t.value / vg.value:.2f}x"
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return ("fail" if bad else "pass"), "; ".join(bad + parts)
