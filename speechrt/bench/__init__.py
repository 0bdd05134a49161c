"""`speechrt bench TARGET`: each target runs ours and its peers in the same process, same input, same
thread count, and prints the ratios. Targets live in their own modules (`add_arguments`, `run`)."""
from __future__ import annotations

import importlib

BENCHES: dict[str, tuple[str, str]] = {
    "asr": ("speechrt.bench.asr", "speech recognition: real-time factor vs faster-whisper (CTranslate2)"),
    "lm": ("speechrt.bench.lm", "language model: time to first token and decode tok/s vs llama.cpp and transformers"),
    "tts": ("speechrt.bench.tts", "speech synthesis: real-time factor and time to first audio vs Piper (piper-tts)"),
    "server": ("speechrt.bench.server", "streaming server: partial/final/voice-to-voice latency over N concurrent streams"),
    "kernels": ("speechrt.bench.kernels", "Triton kernels vs torch eager and torch.compile, against the measured roofline (GPU)"),
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
