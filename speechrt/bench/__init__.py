"""`speechrt bench TARGET`: each family's target runs ours and its peers in the same run, same input, same
thread count, prints the ratios and, with --json, writes the results in one schema (record.py) with the
machine's fingerprint. `all` runs every family; `report` and `compare` read result files; `gpu` validates
a GPU. Targets live in their own modules (`add_arguments`, `run`)."""

from __future__ import annotations

import importlib

BENCHES: dict[str, tuple[str, str]] = {
    "asr": ("speechrt.bench.asr", "speech recognition: real-time factor vs faster-whisper (CTranslate2)"),
    "lm": ("speechrt.bench.lm", "language model: time to first token and decode tok/s vs llama.cpp and transformers"),
    "tts": ("speechrt.bench.tts", "speech synthesis: real-time factor and time to first audio vs Piper (piper-tts)"),
    "server": (
        "speechrt.bench.server",
        "streaming server: partial/final/voice-to-voice latency over N concurrent streams",
    ),
    "startup": (
        "speechrt.bench.startup",
        "seconds from `speechrt serve` to /healthz ready, with an empty cache (cold) and a filled one (warm)",
    ),
    "kernels": (
        "speechrt.bench.kernels",
        "Triton kernels vs torch eager and torch.compile, against the measured roofline (GPU)",
    ),
    "all": ("speechrt.bench.suite", "every family on every backend and precision available here, into one result file"),
    "report": (
        "speechrt.bench.report",
        "merge result files of several machines or commits into an HTML page with plots, or Markdown",
    ),
    "compare": ("speechrt.bench.compare", "exit non-zero when a result file is slower than a base beyond a threshold"),
    "gpu": (
        "speechrt.bench.gpu",
        "GPU validation: kernels, triton backend vs torch, CUDA graphs, ONNX Runtime providers, roofline",
    ),
}


def add_arguments(p):
    sub = p.add_subparsers(dest="target", metavar="TARGET", required=True)
    for name, (mod, help_) in BENCHES.items():
        try:
            m = importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name != mod:  # the command exists but something it imports is missing: a real error
                raise
            continue  # a command whose module is not part of this build
        sp = sub.add_parser(name, help=help_, description=help_)
        m.add_arguments(sp)
        sp.set_defaults(_bench=m.run)


def run(args):
    return args._bench(args)
