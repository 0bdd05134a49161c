"""`speechrt transcribe FILE`: text, or segments with timestamps, or JSON."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def sample_path() -> Path:
    """The bundled sample recording (speech synthesized with the embedded Piper voice)."""
    return Path(__file__).parent / "data" / "sample.wav"


def add_arguments(p):
    p.add_argument("file", nargs="?", help="audio file: WAV, FLAC, OGG, MP3; any sample rate and channel count")
    p.add_argument("--sample", action="store_true", help="transcribe the bundled sample recording")
    p.add_argument("--model", default=None, help="registered name or path (default: whisper-tiny.en)")
    p.add_argument("--backend", default="torch", help="backend (default: torch)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, auto (default: cpu)")
    p.add_argument("--dtype", default=None, help="float32, float16, bfloat16 (default: float32 on CPU, float16 on GPU)")
    p.add_argument("--beam-size", type=int, default=1, help="1 = greedy (default), >1 = beam search")
    p.add_argument("--language", default=None, help="language code for multilingual models (default: detect)")
    p.add_argument("--task", default="transcribe", choices=["transcribe", "translate"],
                   help="translate: English text from speech in another language (multilingual models)")
    p.add_argument("--detect-language", action="store_true", help="print the 5 most likely languages of the first "
                   "30 s with their probabilities (multilingual models), then the transcript")
    p.add_argument("--temperature", type=float, default=None, help="a single temperature (default: 0 with fallback)")
    p.add_argument("--initial-prompt", default=None)
    p.add_argument("--no-timestamps", action="store_true", help="decode without timestamp tokens")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for PyTorch")
    p.add_argument("--json", action="store_true", help="print JSON with segments")
    p.add_argument("--segments", action="store_true", help="print one line per segment with timestamps")


def _ts(t: float) -> str:
    m, s = divmod(t, 60)
    return f"{int(m):02d}:{s:06.3f}"


def run(args):
    from speechrt.errors import UserError

    if args.sample:
        if args.file:
            raise UserError("give either FILE or --sample, not both")
        args.file = str(sample_path())
    if not args.file:
        raise UserError("no audio file given (FILE, or --sample for the bundled recording)")
    from speechrt.models.audio import load_audio
    from speechrt.pipelines.asr import TranscribeOptions, load_asr

    opts = dict(beam_size=args.beam_size, language=args.language, task=args.task,
                initial_prompt=args.initial_prompt, without_timestamps=args.no_timestamps)
    if args.temperature is not None:
        opts["temperatures"] = (args.temperature,)
    TranscribeOptions(**opts)  # the options and the file are checked before the model loads
    audio = load_audio(args.file)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    asr = load_asr(args.model, args.backend, args.device, args.dtype)
    live = args.segments and not args.json
    if args.detect_language and not args.json:
        for code, prob in asr.detect_language(audio, k=5):
            print(f"{code:4} {prob:.3f}")
        print(flush=True)

    def show(seg):
        print(f"[{_ts(seg.start)} --> {_ts(seg.end)}] {seg.text.strip()}", flush=True)

    result = asr.transcribe(audio, on_segment=show if live else None, **opts)
    if args.json:
        out = result.to_dict()
        if args.detect_language:
            out["language_candidates"] = [[c, round(p, 4)] for c, p in asr.detect_language(audio, k=5)]
        json.dump(out, sys.stdout, ensure_ascii=False, indent=2)
        print()
    elif not live:
        print(result.text)
    return 0
