"""The `speechrt` command. Each subcommand lives in its own module with `add_arguments(p)` and `run(args)`."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("speechrt.cli_serve", "run the Realtime WebSocket server (OpenAI Realtime API) on the models"),
    "transcribe": ("speechrt.cli_asr", "transcribe an audio file (WAV/FLAC/OGG, any rate)"),
    "bench": ("speechrt.bench", "benchmarks side by side with peer runtimes"),
    "models": ("speechrt.cli_models", "list the registered models"),
    "chat": ("speechrt.cli_lm", "chat with a small language model, streaming its reply"),
    "say": ("speechrt.cli_tts", "speak text into an audio file with a Piper voice (text argument or stdin)"),
    "export": (
        "speechrt.cli_export",
        "export a model's runner graphs to ONNX (graphs + manifest.json) for onnxruntime/TensorRT",
    ),
    "kernels": ("speechrt.cli_kernels", "Triton kernels: ahead-of-time compile report for NVIDIA and AMD targets"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="speechrt", description="Real-time speech inference runtime")
    p.add_argument("-v", "--verbose", action="store_true", help="log what the runtime chooses")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name, (mod, help_) in COMMANDS.items():
        m = importlib.import_module(mod)
        sp = sub.add_parser(name, help=help_, description=help_)
        # also after the command (`speechrt serve -v`); SUPPRESS keeps an earlier -v when it is not repeated
        sp.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log what the runtime chooses"
        )
        m.add_arguments(sp)
        sp.set_defaults(_run=m.run)
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(name)s: %(message)s")
    if not getattr(args, "_run", None):
        p.print_help()
        return 2
    from speechrt.cli_paths import check_outputs
    from speechrt.errors import UserError

    try:
        check_outputs(args)  # every path the command will write, before it starts (before any model loads)
        return args._run(args) or 0
    except UserError as e:
        print(f"speechrt {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
