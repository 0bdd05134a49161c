"""`speechrt say "text" -o out.wav`: speak text (an argument, or stdin read as it arrives) with a Piper voice."""

from __future__ import annotations

import contextlib
import sys

from speechrt.cli_paths import output_file


def add_arguments(p):
    p.add_argument(
        "text",
        nargs="?",
        help="text to speak; omitted or '-': read stdin (spoken sentence by "
        "sentence as lines arrive, e.g. piped from a language model)",
    )
    p.add_argument(
        "-o",
        "--output",
        default=None,
        type=output_file("-o/--output", "out.wav"),
        help="output file: .wav, .raw/.pcm (pcm16), .f32 (float32), .flac, .mp3, .opus/.ogg (Ogg Opus), .aac "
        "(ADTS), written as synthesized; '-' = stdout (required)",
    )
    p.add_argument(
        "--voice",
        default=None,
        help="registered voice name, Piper .onnx path or owner/name:file.onnx on the Hub "
        "(default: piper-en_US-joe-medium)",
    )
    p.add_argument(
        "--backend",
        default="auto",
        help="torch, onnxruntime or auto (default: auto, the backend and "
        "precision measured fastest on this kind of machine, see backends/auto.py; torch where none was measured)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, auto (default: cpu)")
    p.add_argument("--rate", type=float, default=None, help="speaking rate, 1 = normal, 1.5 = faster, 0.8 = slower")
    p.add_argument("--length-scale", type=float, default=None, help="phoneme length scale (overrides --rate)")
    p.add_argument(
        "--noise-scale", type=float, default=None, help="prior noise (default: the voice's, 0 = deterministic)"
    )
    p.add_argument("--noise-w", type=float, default=None, help="duration noise (default: the voice's)")
    p.add_argument("--speaker", default=None, help="speaker id or name (multi-speaker voices)")
    p.add_argument("--sample-rate", type=int, default=None, help="output sample rate, resampled (default: the voice's)")
    p.add_argument(
        "--format",
        choices=["wav", "pcm16", "f32", "flac", "mp3", "opus", "aac"],
        default=None,
        help="output format (default: from the file suffix; wav for stdout)",
    )
    p.add_argument("--sentence-silence", type=float, default=0.0, help="seconds of silence after each sentence")
    p.add_argument("--seed", type=int, default=None, help="noise seed (torch backend)")
    p.add_argument("--no-normalize", action="store_true", help="do not expand numbers, dates, currency, abbreviations")
    p.add_argument(
        "--on-unsupported",
        choices=["error", "drop"],
        default=None,
        help="characters the voice cannot read (emoji, other scripts): error (the default for TEXT) or drop "
        "with a warning (the default for text read from stdin, as for a language model's replies)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr when writing a file")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for PyTorch")


def run(args):
    from speechrt.errors import UserError
    from speechrt.pipelines.tts import SynthesisOptions, load_tts

    if not args.output:
        raise UserError("no output given: -o out.wav (or .raw for pcm16, .f32 for float32, '-' for stdout)")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    opts = SynthesisOptions(
        length_scale=args.length_scale,
        noise_scale=args.noise_scale,
        noise_w=args.noise_w,
        seed=args.seed,
        sentence_silence=args.sentence_silence,
    )
    tts = load_tts(args.voice, args.backend, args.device)
    controls = dict(
        rate=args.rate if args.length_scale is None else None,
        speaker=args.speaker,
        sample_rate=args.sample_rate,
        format=args.format,
    )
    try:
        stats = _speak(args, tts, opts, controls)
    except BrokenPipeError:  # `speechrt say ... -o - | head`: the reader left; not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if args.output != "-":
        print(
            f"{args.output}: {stats.audio_seconds:.2f} s of audio in {stats.compute_seconds:.2f} s "
            f"(real-time factor {stats.rtf:.3f}, first audio after {stats.first_audio_seconds:.3f} s)",
            file=sys.stderr,
        )
    return 0


def _speak(args, tts, opts, controls):
    from speechrt.errors import UserError

    if args.text in (None, "-"):
        if sys.stdin.isatty():
            print("reading text from stdin (Ctrl-D to end)", file=sys.stderr)

        def pieces():  # line by line, so piped text is spoken as it arrives
            yield from sys.stdin

        stats = tts.synthesize_to_file(
            pieces(), args.output, opts, on_unsupported=args.on_unsupported or "drop", **controls
        )
        if stats.audio_seconds == 0:
            raise UserError("nothing to say: stdin was empty")
    else:
        with _progress_bar(args.output == "-" or args.no_progress) as progress:
            stats = tts.synthesize_to_file(
                args.text,
                args.output,
                opts,
                normalize=not args.no_normalize,
                on_unsupported=args.on_unsupported or "error",
                progress=progress,
                **controls,
            )
    return stats


@contextlib.contextmanager
def _progress_bar(off: bool):
    """A progress(done, total) callback drawing sentences done on stderr (tqdm), or None when `off`."""
    if off:
        yield None
        return
    from tqdm import tqdm

    bar = None

    def progress(done, total):
        nonlocal bar
        if bar is None:
            bar = tqdm(
                total=total, unit="sentence", file=sys.stderr, leave=False, disable=total is not None and total < 2
            )
        bar.update(done - bar.n)

    try:
        yield progress
    finally:
        if bar is not None:
            bar.close()
