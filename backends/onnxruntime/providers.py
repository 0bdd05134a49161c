"""The onnxruntime backend's execution providers per device (with their options, and whether their native
libraries load here) and the session options every graph runs with."""

from __future__ import annotations

import logging

import onnxruntime as ort

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
    fold_dequantize: bool = False,
) -> ort.InferenceSession:
    """A session with every graph optimization; `threads`: intra-op threads (None: ORT's default, all cores).
    spin=False: the pool's threads sleep when a run ends instead of spinning for more work. For a loop that
    runs torch ops between the session's runs (Whisper's logit filters): on two cores the spinning threads
    took the cores from those ops (AMD EPYC, 58-s passage, int8: 6.5 s -> 4.8 s). optimized=True: the
    graph is one ONNX Runtime already optimized for this machine (nchwc.py): only the basic passes run.
    `save_optimized`: a path where ONNX Runtime writes the graph as it optimized it (for this machine only).
    fold_dequantize: DequantizeLinear nodes on constants are folded into float initializers when the graph loads
    (session.disable_quant_qdq; ONNX Runtime otherwise keeps them for its quantized kernels, and they would
    dequantize on every run): the language model's prompt graph (export/llama_weights.py LinearWeights._dense)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if optimized else ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    )
    if threads:
        so.intra_op_num_threads = threads
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if fold_dequantize:
        so.add_session_config_entry("session.disable_quant_qdq", "1")
    if save_optimized:
        so.optimized_model_filepath = save_optimized
        so.log_severity_level = 3  # its warning that the saved graph is for this machine only: it is wanted so
    data = model_or_bytes if isinstance(model_or_bytes, (str, bytes)) else model_or_bytes.SerializeToString()
    return ort.InferenceSession(data, sess_options=so, providers=providers)
