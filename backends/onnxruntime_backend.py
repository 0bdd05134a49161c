"""The `onnxruntime` backend: a model's ONNX graph as shipped, run by ONNX Runtime with the execution
providers for the device (CPU; CUDA or TensorRT on NVIDIA; MIGraphX or ROCm on AMD).

TTS: the Piper voice graph is cut, unchanged, at the generator's input into two sessions — the text encoder,
durations, prior and flow (`latent`) and the HiFi-GAN generator (`vocode`) — so the shared streaming code
can vocode windows of a sentence. `run_graph` runs the whole graph in one session, as Piper does.
"""
from __future__ import annotations

import logging

import numpy as np
import onnxruntime as ort
import torch

from .base import Backend, Latent, TTSRunner

log = logging.getLogger(__name__)

# device kind -> providers in order of preference (each used only if this onnxruntime build has it)
PREFERENCE = {
    "cpu": ["CPUExecutionProvider"],
    "cuda": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "MIGraphXExecutionProvider",
             "ROCMExecutionProvider", "CPUExecutionProvider"],
}


def providers_for(device: str | None) -> list:
    """Execution providers (with options) for `device` in {'cpu', 'cuda', 'cuda:N', 'auto', None}."""
    from speechrt.errors import UserError

    have = ort.get_available_providers()
    dev = (device or "auto").lower()
    index = 0
    if dev.startswith("cuda:"):
        index = int(dev.split(":", 1)[1])
        dev = "cuda"
    if dev not in ("cpu", "cuda", "auto"):
        raise UserError(f"unsupported device {device!r} for onnxruntime; valid: cpu, cuda, cuda:N, auto "
                        "(AMD GPUs are 'cuda' too: MIGraphX/ROCm providers are used)")
    if dev == "cpu":
        return ["CPUExecutionProvider"]
    gpu = [p for p in PREFERENCE["cuda"] if p in have and p != "CPUExecutionProvider"]
    if not gpu:
        if dev == "auto":
            return ["CPUExecutionProvider"]
        raise UserError(f"device {device!r}: this onnxruntime build has no GPU execution provider (available: "
                        f"{', '.join(have)}); install onnxruntime-gpu (NVIDIA) or onnxruntime-rocm / "
                        "onnxruntime-migraphx (AMD), or use --device cpu")
    out = []
    for p in gpu:
        opts = {"device_id": index}
        if p == "TensorrtExecutionProvider":
            # engines are rebuilt per input shape; cache them so each length is built once
            opts.update(trt_engine_cache_enable=True, trt_engine_cache_path=".speechrt-trt-cache")
        if p == "CUDAExecutionProvider":
            opts["cudnn_conv_algo_search"] = "HEURISTIC"  # exhaustive search per new length costs seconds
        out.append((p, opts))
    return out + ["CPUExecutionProvider"]


def session(model_or_bytes, providers) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    data = model_or_bytes if isinstance(model_or_bytes, (str, bytes)) else model_or_bytes.SerializeToString()
    return ort.InferenceSession(data, sess_options=so, providers=providers)


def split_at_generator(model):
    """Cut a Piper graph at the generator's inputs -> (prefix ModelProto, decoder ModelProto, cut names).

    The generator's inputs are the tensors that nodes named /dec/... consume but do not produce themselves
    and that are not initializers: z (the masked flow output) and, in multi-speaker voices, the speaker
    embedding. The first cut name is always z (the input of /dec/conv_pre/Conv).
    """
    from onnx.utils import Extractor

    g = model.graph
    inits = {t.name for t in g.initializer}
    dec_nodes = [n for n in g.node if n.name.startswith("/dec/")]
    produced = {o for n in dec_nodes for o in n.output}
    pre = next((n for n in dec_nodes if n.name == "/dec/conv_pre/Conv"), None)
    if pre is None:
        raise ValueError("no /dec/conv_pre/Conv node")
    cuts = [pre.input[0]]
    for n in dec_nodes:
        for i in n.input:
            if i and i not in produced and i not in inits and i not in cuts:
                cuts.append(i)
    graph_inputs = [i.name for i in g.input if i.name not in inits]
    outputs = [o.name for o in g.output][:1]
    # the Extractor needs a value_info for each cut; shape inference does not always produce one
    # (dynamic shapes), and the cuts are float activations of any shape
    import onnx
    model = onnx.shape_inference.infer_shapes(model)
    known = {v.name for v in model.graph.value_info}
    for name in cuts:
        if name not in known:
            model.graph.value_info.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    ex = Extractor(model)
    return ex.extract_model(graph_inputs, cuts), ex.extract_model(cuts, outputs), cuts


class OrtTTSRunner(TTSRunner):
    def __init__(self, path, providers):
        from speechrt.models.piper_loader import (VoiceConfig, check_voice, config_from_weights, load_onnx,
                                                 read_onnx_weights, voice_paths)
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
        prefix, dec, self.cuts = split_at_generator(model)
        self.prefix = session(prefix, providers)
        self.dec = session(dec, providers)
        self._full = None
        log.info("onnxruntime TTS: %s on %s", onnx_path.name, self.dec.get_providers())

    def _feed(self, phoneme_ids, o):
        feed = {"input": np.array([phoneme_ids], dtype=np.int64),
                "input_lengths": np.array([len(phoneme_ids)], dtype=np.int64),
                "scales": np.array([o.noise_scale, o.length_scale, o.noise_w], dtype=np.float32)}
        if "sid" in self.input_names:
            feed["sid"] = np.array([o.speaker_id if o.speaker_id is not None else 0], dtype=np.int64)
        return feed

    def latent(self, phoneme_ids, options) -> Latent:
        # options.seed cannot reach the graph's RandomNormalLike nodes; only noise scales of 0 are reproducible
        o = options.resolved(self.voice)
        outs = self.prefix.run(self.cuts, self._feed(phoneme_ids, o))
        return Latent(torch.from_numpy(outs[0]), outs[1:])

    def vocode(self, latent: Latent, start: int, end: int) -> torch.Tensor:
        feed = {self.cuts[0]: np.ascontiguousarray(latent.z[:, :, start:end].numpy())}
        for name, v in zip(self.cuts[1:], latent.cond):
            feed[name] = v
        return torch.from_numpy(self.dec.run(None, feed)[0].reshape(-1))

    def run_graph(self, phoneme_ids, options) -> np.ndarray:
        """The whole shipped graph in one session (no streaming) -> float32 audio [n]."""
        if self._full is None:
            self._full = session(str(self.path), self.providers)
        return self._full.run(None, self._feed(phoneme_ids, options.resolved(self.voice)))[0].reshape(-1)


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def tts(self, model, device="cpu", dtype=None):
        from speechrt.errors import UserError

        if model.format != "piper-onnx":
            raise UserError(f"{model.name}: the onnxruntime TTS runner runs Piper voices (piper-onnx), not {model.format}")
        if dtype not in (None, "float32"):
            raise UserError(f"the onnxruntime backend runs the voice graph as shipped (float32); got dtype {dtype!r}")
        return OrtTTSRunner(model.path, providers_for(device))
