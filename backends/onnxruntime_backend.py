"""The `onnxruntime` backend: each family's exported graphs (export/; made on first use for a model name)
run by ONNX Runtime with the execution providers for the device (CPU; CUDA or TensorRT on NVIDIA; MIGraphX
or ROCm on AMD). The runners live in onnxruntime_{asr,lm,tts}.py.

TTS: a voice runs as our VITS exported in pieces (onnxruntime_tts). `OrtTTSRunner` runs a Piper voice's
shipped graph instead, cut, unchanged, into three sessions — text encoder, durations and prior sample; the
reverse flow; the HiFi-GAN generator — so that, as with the torch runner, the flow runs on the first windows'
frames before the first audio and on the rest in the background, and the shared streaming code vocodes
windows of a sentence; `run_graph` runs the whole graph in one session, as Piper does (the GPU check of
`bench gpu` and the tests use it).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import torch

from .base import Backend, Latent, RunnerInfo, TTSRunner
from .torch_backend import ThreadPolicy

log = logging.getLogger(__name__)

# device kind -> GPU providers in order of preference, and what to install for them
GPU_PROVIDERS = {
    "cuda": (["TensorrtExecutionProvider", "CUDAExecutionProvider"], "onnxruntime-gpu"),
    "rocm": (["MIGraphXExecutionProvider", "ROCMExecutionProvider"], "onnxruntime-rocm (or onnxruntime-migraphx)"),
}
DEVICE_HELP = "valid: cpu, cuda, cuda:N, rocm, rocm:N, auto"
# providers that onnxruntime-gpu lists whenever it was built with them, though they load a library of their
# own at session creation: -> (that library's names, what to install)
NATIVE = {
    "TensorrtExecutionProvider": (("libnvinfer.so.10", "libnvinfer.so", "nvinfer_10.dll"), "tensorrt"),
    "MIGraphXExecutionProvider": (("libmigraphx_c.so.3", "libmigraphx_c.so"), "migraphx (ROCm)"),
}


def provider_loadable(provider: str) -> bool:
    """Whether `provider`'s own native library loads here (True for providers without one). The TensorRT
    provider of onnxruntime-gpu is listed as available without TensorRT installed, and asking for it then
    fails at session creation; ORT's retry without it also drops every provider option."""
    import ctypes

    if provider not in NATIVE:
        return True
    if provider == "TensorrtExecutionProvider":
        try:
            import tensorrt  # noqa: F401  (the pip package loads its libraries from tensorrt_libs)
        except ImportError:
            pass
    for name in NATIVE[provider][0]:
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


def providers_for(device: str | None) -> list:
    """Execution providers (with options) for `device` in {'cpu', 'cuda[:N]', 'rocm[:N]', 'auto', None}.
    'cuda' takes the NVIDIA providers, or the AMD ones where only those are installed (PyTorch calls ROCm
    devices 'cuda' too); an explicit GPU device without its provider is an error naming what to install."""
    from speechrt.errors import UserError

    have = ort.get_available_providers()
    dev = (device or "auto").lower()
    index = 0
    if ":" in dev:
        dev, _, n = dev.partition(":")
        if not n.isdigit():
            raise UserError(f"unsupported device {device!r} for onnxruntime; {DEVICE_HELP}")
        index = int(n)
    if dev not in ("cpu", "cuda", "rocm", "auto"):
        raise UserError(f"unsupported device {device!r} for onnxruntime; {DEVICE_HELP}")
    if dev == "cpu":
        return ["CPUExecutionProvider"]
    kinds = ["cuda", "rocm"] if dev in ("cuda", "auto") else ["rocm"]
    listed = [p for k in kinds for p in GPU_PROVIDERS[k][0] if p in have]
    gpu = [p for p in listed if provider_loadable(p)]
    for p in listed:
        if p not in gpu:
            log.info(
                "onnxruntime lists %s but its library does not load here (pip install %s): not used", p, NATIVE[p][1]
            )
    if not gpu:
        if dev == "auto":
            return ["CPUExecutionProvider"]
        wanted, install = GPU_PROVIDERS["rocm" if dev == "rocm" else "cuda"]
        raise UserError(
            f"device {device!r}: this onnxruntime {ort.__version__} has no GPU execution provider "
            f"({' or '.join(wanted)}; available: {', '.join(have)}); pip uninstall onnxruntime && "
            f"pip install {install}, or use --device cpu"
        )
    out = [(p, provider_options(p, index)) for p in gpu]
    return out + ["CPUExecutionProvider"]


def provider_options(provider: str, index: int = 0) -> dict:
    """The options speechrt runs GPU execution provider `provider` with, on device `index`."""
    opts = {"device_id": index}
    if provider == "TensorrtExecutionProvider":
        # engines are rebuilt per input shape; cache them so each length is built once
        opts.update(trt_engine_cache_enable=True, trt_engine_cache_path=".speechrt-trt-cache")
    if provider == "CUDAExecutionProvider":
        opts["cudnn_conv_algo_search"] = "HEURISTIC"  # the exhaustive search per new input length costs seconds
        # float32 graphs in float32: with TF32 (the provider's default) the voice's audio was 0.011-0.019 off the
        # CPU provider's, without it 2e-5 (H100, onnxruntime-gpu 1.31); the GPU defaults are float16 graphs anyway
        opts["use_tf32"] = 0
    return opts


def session(
    model_or_bytes,
    providers,
    threads: int | None = None,
    spin: bool = True,
    optimized: bool = False,
    save_optimized: str | None = None,
) -> ort.InferenceSession:
    """A session with every graph optimization; `threads`: intra-op threads (None: ORT's default, all cores).
    spin=False: the pool's threads sleep when a run ends instead of spinning for more work. For a loop that
    runs torch ops between the session's runs (Whisper's logit filters): on two cores the spinning threads
    took the cores from those ops (AMD EPYC, 58-s passage, int8: 6.5 s -> 4.8 s). optimized=True: the
    graph is one ONNX Runtime already optimized for this machine (ort_nchwc): only the basic passes run.
    `save_optimized`: a path where ONNX Runtime writes the graph as it optimized it (for this machine only)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if optimized else ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    )
    if threads:
        so.intra_op_num_threads = threads
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if save_optimized:
        so.optimized_model_filepath = save_optimized
        so.log_severity_level = 3  # its warning that the saved graph is for this machine only: it is wanted so
    data = model_or_bytes if isinstance(model_or_bytes, (str, bytes)) else model_or_bytes.SerializeToString()
    return ort.InferenceSession(data, sess_options=so, providers=providers)


def _module_inputs(model, prefix: str) -> list[str]:
    """Tensors that the nodes of module `prefix` ('/dec/', '/flow/') consume from outside it: not produced
    by the module, not initializers, and not computed from the module's own outputs (unnamed nodes that
    torch.onnx leaves between a module's named nodes, e.g. the WaveNet gates)."""
    g = model.graph
    inits = {t.name for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    mod = [n for n in g.node if n.name.startswith(prefix)]
    inside = {o for n in mod for o in n.output}

    def depends_on_module(t, seen):
        n = producer.get(t)
        if n is None or t in seen:
            return False
        seen.add(t)
        return any(i in inside or depends_on_module(i, seen) for i in n.input if i)

    out = []
    for n in mod:
        for i in n.input:
            if i and i not in inside and i not in inits and i not in out and not depends_on_module(i, set()):
                out.append(i)
    return out


def split_graph(model):
    """Cut a Piper graph, unchanged, into (prefix, flow, generator) ModelProtos around the reverse flow
    and the HiFi-GAN generator -> (prefix, flow, dec, flow_cuts, dec_cuts).

    dec_cuts[0] is z (the input of /dec/conv_pre/Conv), flow_cuts[0] the flow's sample z_p, the others the
    masks and speaker embedding they also read. `flow` is None where the flow cannot be cut out cleanly
    (then the prefix runs up to z)."""
    import onnx
    from onnx.utils import Extractor

    g = model.graph
    inits = {t.name for t in g.initializer}
    pre = next((n for n in g.node if n.name == "/dec/conv_pre/Conv"), None)
    if pre is None:
        raise ValueError("no /dec/conv_pre/Conv node")
    dec_cuts = [pre.input[0]] + [t for t in _module_inputs(model, "/dec/") if t != pre.input[0]]
    flow_cuts = _module_inputs(model, "/flow/")
    graph_inputs = [i.name for i in g.input if i.name not in inits]
    outputs = [o.name for o in g.output][:1]
    # the Extractor needs a value_info for each cut; shape inference does not always produce one
    # (dynamic shapes), and the cuts are float activations of any shape
    model = onnx.shape_inference.infer_shapes(model)
    known = {v.name for v in model.graph.value_info}
    for name in dec_cuts + flow_cuts:
        if name not in known:
            model.graph.value_info.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    ex = Extractor(model)
    dec = ex.extract_model(dec_cuts, outputs)
    flow = None
    if flow_cuts:
        try:
            flow = ex.extract_model(flow_cuts, dec_cuts[:1])
            if {i.name for i in flow.graph.input} - set(flow_cuts):
                flow = None  # the flow reads more than its cut inputs (e.g. text-side tensors): no clean cut
        except Exception as e:  # noqa: BLE001 - any failure means: do not cut here
            log.info("onnxruntime TTS: flow not cut out (%s); the prefix runs it", e)
            flow = None
    if flow is None:
        flow_cuts = []
    head = flow_cuts + [t for t in dec_cuts[1:] if t not in flow_cuts] if flow is not None else dec_cuts
    prefix = ex.extract_model(graph_inputs, head)
    return prefix, flow, dec, flow_cuts, dec_cuts


class OrtTTSRunner(TTSRunner):
    def __init__(self, path, providers, model_name: str = ""):
        from speechrt.models.piper_loader import (
            VoiceConfig,
            check_voice,
            config_from_weights,
            load_onnx,
            read_onnx_weights,
            voice_paths,
        )
        from speechrt.models.registry import ModelError

        onnx_path, json_path = voice_paths(path)
        self.voice = VoiceConfig.from_file(json_path)
        model = load_onnx(onnx_path)
        try:
            cfg = config_from_weights(read_onnx_weights(model))
        except ModelError as e:
            raise ModelError(f"{onnx_path}: {e}") from None
        check_voice(self.voice, cfg, onnx_path)
        self.config = cfg
        self.sample_rate = self.voice.sample_rate
        self.hop_length = cfg.hop_length
        self.context_frames = cfg.vocoder_context()
        self.providers = providers
        self.path = onnx_path
        self.input_names = {i.name for i in model.graph.input}
        prefix, flow, dec, self.flow_cuts, self.cuts = split_graph(model)
        self.prefix = session(prefix, providers)
        self.head_names = [o.name for o in prefix.graph.output]
        self.flow = session(flow, providers) if flow is not None else None
        self.dec = session(dec, providers)
        self.flow_context = cfg.flow_context()
        self._bg = ThreadPoolExecutor(1, thread_name_prefix="speechrt-ort-flow")
        self._full = None
        device = "cpu" if self.dec.get_providers()[0] == "CPUExecutionProvider" else "cuda"
        self.device = torch.device(device)
        self.info = RunnerInfo(
            "onnxruntime",
            model_name or onnx_path.stem,
            "piper-onnx",
            "float32",
            device,
            ", ".join(self.dec.get_providers()),
        )
        log.info("onnxruntime TTS: %s", self.info)

    def _feed(self, phoneme_ids, o):
        feed = {
            "input": np.array([phoneme_ids], dtype=np.int64),
            "input_lengths": np.array([len(phoneme_ids)], dtype=np.int64),
            "scales": np.array([o.noise_scale, o.length_scale, o.noise_w], dtype=np.float32),
        }
        if "sid" in self.input_names:
            feed["sid"] = np.array([o.speaker_id if o.speaker_id is not None else 0], dtype=np.int64)
        return feed

    def latent(self, phoneme_ids, options) -> Latent:
        # options.seed cannot reach the graph's RandomNormalLike nodes; only noise scales of 0 are reproducible
        o = options.resolved(self.voice)
        outs = dict(zip(self.head_names, self.prefix.run(self.head_names, self._feed(phoneme_ids, o))))
        extra = [outs[n] for n in self.cuts[1:]]  # the generator's other inputs (masks, speaker embedding)
        if self.flow is None:
            return Latent(torch.from_numpy(outs[self.cuts[0]]), extra)
        fin = [outs[n] for n in self.flow_cuts]
        F = fin[0].shape[-1]
        head = self.head_frames(F, options)
        z = torch.empty(fin[0].shape[:-1] + (F,), dtype=torch.float32)
        self._flow_into(z, fin, 0, head)
        if head >= F:
            return Latent(z, extra)
        return Latent(z, extra, head, [(F, self._bg.submit(self._flow_into, z, fin, head, F))])

    def _flow_into(self, z, fin, start, end):
        c, F = self.flow_context, z.shape[-1]
        lo, hi = max(0, start - c), min(F, end + c)
        # every flow input is [1, C, F] along time except the speaker embedding [1, C, 1]
        feed = {n: np.ascontiguousarray(v[..., lo:hi] if v.shape[-1] == F else v) for n, v in zip(self.flow_cuts, fin)}
        out = self.flow.run(None, feed)[0]
        z[:, :, start:end] = torch.from_numpy(out[:, :, start - lo : end - lo])

    def vocode(self, latent: Latent, start: int, end: int) -> torch.Tensor:
        latent.wait_for(end)
        feed = {self.cuts[0]: np.ascontiguousarray(latent.z[:, :, start:end].numpy())}
        for name, v in zip(self.cuts[1:], latent.vocoder_inputs):
            feed[name] = v
        return torch.from_numpy(self.dec.run(None, feed)[0].reshape(-1))

    def run_graph(self, phoneme_ids, options) -> np.ndarray:
        """The whole shipped graph in one session (no streaming) -> float32 audio [n]."""
        if self._full is None:
            self._full = session(str(self.path), self.providers)
        return self._full.run(None, self._feed(phoneme_ids, options.resolved(self.voice)))[0].reshape(-1)


# what `dtype` may be for the exported families -> export precision (None: the backend's default)
PRECISION = {
    None: None,
    "auto": None,
    "float32": "fp32",
    "fp32": "fp32",
    "float16": "fp16",
    "fp16": "fp16",
    "int8": "int8",
    "int4": "int4",
    "q4": "int4",
}


def export_dir(model, family: str, dtype: str | None, default: str, activations: str | None = None):
    """(directory, manifest) of `model`'s ONNX export at the precision `dtype` asks for: the model itself if
    it is an export, else the export cache's copy (made now, on first use; `activations`: see export_model)."""
    from speechrt.errors import UserError
    from speechrt.export import Manifest, cached_export

    if dtype not in PRECISION:
        raise UserError(f"unsupported dtype {dtype!r} for onnxruntime; valid: {', '.join(k for k in PRECISION if k)}")
    want = PRECISION[dtype]
    if model.format == "speechrt-onnx":
        m = Manifest.read(model.path)
        if want is not None and want != m.precision:
            raise UserError(
                f"{model.path} is a {m.precision} export; dtype {dtype!r} needs another export "
                f"(speechrt export {family} --precision {want})"
            )
        return model.path, m
    d = cached_export(family, model, want or default, activations=activations)
    return d, Manifest.read(d)


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    families = ("asr", "lm", "tts")

    def asr(self, model, device="cpu", dtype=None, step_threads=None):
        from .onnxruntime_asr import OrtASRRunner
        from .onnxruntime_auto import default_precision

        providers = providers_for(device)
        d, m = export_dir(model, "asr", dtype, default_precision("asr", providers))
        return OrtASRRunner(d, m, providers, _threads(providers, step_threads), model.name)

    def lm(self, model, device="cpu", dtype=None, step_threads=None):
        from .onnxruntime_auto import default_precision
        from .onnxruntime_lm import OrtLMRunner

        providers = providers_for(device)
        default = default_precision("lm", providers)
        on_cpu = providers[0] == "CPUExecutionProvider"
        d, m = export_dir(model, "lm", dtype, default) if on_cpu else gpu_lm_export(model, dtype, default)
        return OrtLMRunner(d, m, providers, _threads(providers, step_threads), model.name, step_threads)

    def tts(self, model, device="cpu", dtype=None, step_threads=None):
        """Our VITS exported in pieces (export/vits_export.py; made on first use for a Piper voice, ~3 s), not
        the voice's shipped graph (OrtTTSRunner): measured faster (30 words, AMD EPYC AVX2: RTF 1.39x Piper's
        vs 1.50x on the shipped graph cut in three, first audio 115 vs 121 ms; since then 0.96x with 2-D
        convolutions and the current windows, docs/onnx-runtime.md)."""
        from speechrt.errors import UserError

        from .onnxruntime_tts import exported_tts_runner

        if dtype not in (None, "float32", "fp32", "auto"):
            raise UserError(f"the onnxruntime backend runs voices in float32; got dtype {dtype!r}")
        if model.format not in ("speechrt-onnx", "piper-onnx"):
            raise UserError(
                f"{model.name}: the onnxruntime TTS runner runs Piper voices (piper-onnx) or exports, "
                f"not {model.format}"
            )
        d, m = export_dir(model, "tts", None, "fp32")
        return exported_tts_runner(d, m, providers_for(device), model.name)


def gpu_lm_export(model, dtype, default):
    """The language model's export for a GPU execution provider: float16 activations and cache throughout
    (their GroupQueryAttention has no float32 kernel: a float32 graph ran its attention on the CPU provider and
    gave wrong ids from the first decode step, H100, onnxruntime-gpu 1.31)."""
    from speechrt.errors import UserError

    want = PRECISION.get(dtype) or default
    if want == "fp32":
        raise UserError(
            "the onnxruntime language model on a GPU runs in float16: its GroupQueryAttention has no "
            "float32 kernel there; valid dtypes on a GPU: float16, int4, int8 (weight-only, float16 "
            "activations)"
        )
    d, m = export_dir(model, "lm", dtype, default, activations="float16" if want in ("int4", "int8") else None)
    if m.cache["dtype"] != "float16":
        raise UserError(
            f"{d} keeps its activations in {m.cache['dtype']}, which GPU execution providers cannot run "
            f"(no float32 GroupQueryAttention); export it with --activations float16, or use --device cpu"
        )
    return d, m


def _threads(providers, step_threads):
    from .ort_binding import providers_device

    return ThreadPolicy.build(providers_device(providers), step_threads)
