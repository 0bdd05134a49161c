"""A Piper voice's shipped graph on ONNX Runtime (OrtTTSRunner): cut, unchanged, into three sessions — text
encoder, durations and prior sample; the reverse flow; the HiFi-GAN generator — so that, as with the other TTS
runners, the flow runs on the first windows' frames before the first audio and on the rest in the background,
and the shared streaming code vocodes windows of a sentence; `run_graph` runs the whole graph in one session, as
Piper does (the GPU check of `bench gpu` and the tests use it). The backend itself runs voices as their export
(tts.py): measured faster."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from ..base import Latent, RunnerInfo, TTSRunner
from .providers import session

log = logging.getLogger(__name__)


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
