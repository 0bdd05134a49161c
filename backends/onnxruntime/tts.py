"""TTS on the `onnxruntime` backend from an export of our torch VITS (export/vits_export.py: text, flow and
generator graphs): `OrtVits` has the inference members of models.vits.VITS, backed by ONNX Runtime
sessions, so the torch TTS runner's streaming (the flow on the first windows first, the rest in the
background; windows vocoded side by side on one-thread workers) runs it unchanged. Each session runs on one
intra-op thread; the runner's workers run windows in parallel."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..base import RunnerInfo
from ..threads import ThreadPolicy
from ..tts_runner import TorchTTSRunner


class _Flow:
    def __init__(self, owner, graph: str):
        self.owner, self.graph = owner, graph

    def reverse(self, z_p, mask, g=None):
        return self.owner.run(self.graph, z_p=z_p, g=g)


class OrtVits:
    def __init__(self, directory, manifest, providers, wide_threads: int = 1):
        from speechrt.models.vits import VitsConfig

        from .nchwc import joined_session
        from .providers import session

        conf = dict(manifest.config)
        for k in ("resblock_kernel_sizes", "upsample_rates", "upsample_kernel_sizes"):
            conf[k] = tuple(conf[k])
        conf["resblock_dilation_sizes"] = tuple(tuple(d) for d in conf["resblock_dilation_sizes"])
        self.config = VitsConfig(**conf)
        # the windows' graphs on one thread each (the runner's workers run them side by side); the text graph
        # and the flow's head run alone at a sentence's start, when no window is ready yet: all threads
        self.files = files = {name: str(directory / g.file) for name, g in manifest.graphs.items()}
        self.sessions = {
            name: session(f, providers, 1) for name, f in files.items() if name not in ("generator", "text")
        }
        # the generator without the reorders between its blocked-layout convolutions (nchwc.py)
        self.sessions["generator"], self.reorders_removed = joined_session(files["generator"], providers, 1)
        self.sessions["text"] = session(files["text"], providers, wide_threads, spin=False)
        self.sessions["flow/wide"] = session(files["flow"], providers, wide_threads, spin=False)
        self.inputs = {name: {i.name for i in s.get_inputs()} for name, s in self.sessions.items()}
        self.flow = _Flow(self, "flow")
        self.wide_flow = _Flow(self, "flow/wide")

    def run(self, graph: str, **feeds):
        """Run one graph on torch tensors (inputs it does not declare are left out) -> its first output."""
        feed = {
            k: np.ascontiguousarray(v.numpy()) for k, v in feeds.items() if v is not None and k in self.inputs[graph]
        }
        return torch.from_numpy(self.sessions[graph].run(None, feed)[0])

    def speaker(self, sid):
        return None if self.config.n_speakers <= 1 else self.run("speaker", sid=sid)

    def prior(self, ids, length_scale, noise_scale_w, g=None, generator=None):
        """models.vits.VITS.prior: the text graph, then durations and expansion as torch ops."""
        from speechrt.models.vits import expand_prior

        noise = torch.zeros(1, 2, ids.shape[1])
        if self.config.use_sdp:  # the same draw as the torch model's, so a seed gives the same voice
            noise = torch.randn(1, 2, ids.shape[1], generator=generator) * noise_scale_w
        text = self.sessions["text"]
        feed = {
            k: np.ascontiguousarray(v.numpy())
            for k, v in (("ids", ids), ("dp_noise", noise), ("g", g))
            if v is not None and k in self.inputs["text"]
        }
        m, logs, logw = (torch.from_numpy(a) for a in text.run(["m", "logs", "logw"], feed))
        return expand_prior(m, logs, logw, length_scale)

    def dec(self, z, g=None):
        return self.run("generator", z=z.contiguous(), g=g)


def exported_tts_runner(path: Path, manifest, providers, name: str) -> TorchTTSRunner:
    """A TTS runner over the export in `path` (its `manifest`), called `name`."""
    from speechrt.models.piper_loader import VoiceConfig

    from .binding import providers_device

    voice = VoiceConfig.from_file(path / manifest.extra["voice"])
    device = providers_device(providers)
    threads = ThreadPolicy.build(torch.device("cpu"), None)
    runner = TorchTTSRunner(
        OrtVits(path, manifest, providers, threads.total),
        voice,
        torch.device("cpu"),
        torch.float32,
        threads,
        "onnxruntime",
        name,
        "speechrt-onnx",
    )
    runner.info = RunnerInfo("onnxruntime", name, "speechrt-onnx", "fp32", str(device), runner.info.threads)
    return runner
