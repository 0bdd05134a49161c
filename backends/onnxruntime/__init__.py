"""The `onnxruntime` backend: each family's exported graphs (export/; made on first use for a model name)
run by ONNX Runtime with the execution providers for the device (CPU; CUDA or TensorRT on NVIDIA; MIGraphX
or ROCm on AMD; providers.py). The runners live in asr.py, lm.py and tts.py (a voice runs as our VITS
exported in pieces); shipped.py runs a Piper voice's own graph instead.
"""

from __future__ import annotations

from ..base import Backend
from ..threads import ThreadPolicy
from .exports import export_dir, gpu_lm_export
from .providers import providers_for


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    families = ("asr", "lm", "tts")

    def asr(self, model, device="cpu", dtype=None, step_threads=None):
        from .asr import OrtASRRunner
        from .precision import default_precision

        providers = providers_for(device)
        d, m = export_dir(model, "asr", dtype, default_precision("asr", providers))
        return OrtASRRunner(d, m, providers, _threads(providers, step_threads), model.name)

    def lm(self, model, device="cpu", dtype=None, step_threads=None):
        from .lm import OrtLMRunner
        from .precision import default_precision

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

        from .tts import exported_tts_runner

        if dtype not in (None, "float32", "fp32", "auto"):
            raise UserError(f"the onnxruntime backend runs voices in float32; got dtype {dtype!r}")
        if model.format not in ("speechrt-onnx", "piper-onnx"):
            raise UserError(
                f"{model.name}: the onnxruntime TTS runner runs Piper voices (piper-onnx) or exports, "
                f"not {model.format}"
            )
        d, m = export_dir(model, "tts", None, "fp32")
        return exported_tts_runner(d, m, providers_for(device), model.name)


def _threads(providers, step_threads):
    from .binding import providers_device

    return ThreadPolicy.build(providers_device(providers), step_threads)
