"""`speechrt transcribe FILE ...`: text, JSON, verbose JSON, SRT or VTT (the formats of the server's
/v1/audio/transcriptions, speechrt/pipelines/formats.py), or segments with timestamps as they are decoded;
several files in one call, printed one after another or written to --output-dir."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from speechrt.cli_paths import output_dir


def sample_path() -> Path:
    """The bundled sample recording (speech synthesized with the embedded Piper voice)."""
    return Path(__file__).parent / "data" / "sample.wav"


def add_arguments(p):
    p.add_argument("file", nargs="*", help="audio files: WAV, FLAC, OGG, MP3; any sample rate and channel count")
    p.add_argument("--sample", action="store_true", help="transcribe the bundled sample recording")
    p.add_argument(
        "--model", default=None, help="registered name, path or Hugging Face Hub id (default: whisper-tiny.en)"
    )
    p.add_argument(
        "--backend",
        default="auto",
        help="torch, triton, onnxruntime or auto (default: auto, the backend and "
        "precision measured fastest on this kind of machine, see backends/auto.py; torch where none was measured)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N, auto (default: cpu)")
    p.add_argument(
        "--dtype",
        default=None,
        help="float32, float16, bfloat16, int8 (onnxruntime) (default: the "
        "precision --backend auto chose; on another backend float32 on CPU, float16 on GPU)",
    )
    p.add_argument("--beam-size", type=int, default=1, help="1 = greedy (default), >1 = beam search")
    p.add_argument("--language", default=None, help="language code for multilingual models (default: detect)")
    p.add_argument(
        "--task",
        default="transcribe",
        choices=["transcribe", "translate"],
        help="translate: English text from speech in another language (multilingual models) (default: %(default)s)",
    )
    p.add_argument(
        "--detect-language",
        action="store_true",
        help="print the 5 most likely languages of the first "
        "30 s with their probabilities (multilingual models), then the transcript",
    )
    p.add_argument("--temperature", type=float, default=None, help="a single temperature (default: 0 with fallback)")
    p.add_argument(
        "--initial-prompt",
        default=None,
        help="text the first window is decoded after, to steer spelling and style (names, terms; default: none)",
    )
    p.add_argument("--no-timestamps", action="store_true", help="decode without timestamp tokens")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for PyTorch (default: all cores)")
    p.add_argument(
        "--format",
        default=None,
        help='output format: txt (default), json ({"text"}), verbose_json '
        "(text, language, duration, segments), srt, vtt: the same as the server's response_format",
    )
    p.add_argument("--json", action="store_true", help="same as --format verbose_json")
    p.add_argument("--segments", action="store_true", help="print one line per segment with timestamps, as decoded")
    p.add_argument(
        "--output-dir",
        default=None,
        type=output_dir("--output-dir"),
        help="write each FILE's transcript to DIR/FILE.<ext> (txt, json, srt, vtt) instead of printing it",
    )
    p.add_argument(
        "--progress",
        action="store_true",
        help="a progress bar on stderr for every file (default: for files over 30 s when stderr is a terminal)",
    )
    p.add_argument(
        "--vad-filter",
        action="store_true",
        help="decode only the speech Silero VAD finds (faster-whisper's vad_filter); times stay the file's",
    )
    p.add_argument(
        "--vad-threshold", type=float, default=None, help="with --vad-filter: speech probability (default 0.5)"
    )
    p.add_argument(
        "--vad-min-silence-ms",
        type=int,
        default=None,
        help="with --vad-filter: a pause this long ends a speech region (default 2000)",
    )
    p.add_argument(
        "--vad-speech-pad-ms",
        type=int,
        default=None,
        help="with --vad-filter: audio kept on both sides of each speech region (default 400)",
    )
    p.add_argument(
        "--silence-level-db",
        type=_level,
        default=-60.0,
        metavar="DB|off",
        help="silence gate: 30-s windows whose loudest 10 ms is quieter than DB dBFS are not decoded "
        "(default -60; off: decode every window)",
    )
    p.add_argument(
        "--whole-windows",
        action="store_true",
        help="encode every 30-s window whole, a recording's last too (faster-whisper's windows exactly; "
        "default: the last window of a long recording is encoded over its audio and 5 s more)",
    )
    p.add_argument(
        "--word-timestamps",
        action="store_true",
        help="time each word (cross-attention alignment, as faster-whisper): one line per segment, "
        "then its words with start, end and probability; in --json/verbose_json each segment gets `words`",
    )


def _level(v: str) -> float | None:
    if v.lower() in ("off", "none"):
        return None
    try:
        return float(v)
    except ValueError:
        import argparse

        raise argparse.ArgumentTypeError(f"{v!r} is not a level in dBFS (a number such as -60) or 'off'") from None


def vad_options(args) -> dict:
    """The transcription options of --vad-filter and its --vad-* parameters (an error if those come alone)."""
    from speechrt.errors import UserError

    given = {
        k: v
        for k, v in (
            ("threshold", args.vad_threshold),
            ("min_silence_duration_ms", args.vad_min_silence_ms),
            ("speech_pad_ms", args.vad_speech_pad_ms),
        )
        if v is not None
    }
    if given and not args.vad_filter:
        raise UserError("--vad-threshold, --vad-min-silence-ms and --vad-speech-pad-ms apply to --vad-filter; add it")
    return {"vad_filter": True, "vad_parameters": given} if args.vad_filter else {}


def _ts(t: float) -> str:
    m, s = divmod(t, 60)
    return f"{int(m):02d}:{s:06.3f}"


def output_format(args) -> str:
    """The --format asked for (--json is verbose_json), checked before any model loads."""
    from speechrt.errors import UserError
    from speechrt.pipelines.formats import check_format

    if args.json and args.format not in (None, "verbose_json"):
        raise UserError(f"--json is --format verbose_json; it cannot be combined with --format {args.format}")
    if args.segments and (args.json or args.format):
        raise UserError("--segments prints lines as segments are decoded; give it without --json/--format")
    return check_format("verbose_json" if args.json else args.format or "text")


class Progress:
    """A bar over a file's duration, advanced to each decoded segment's end (tqdm, on stderr)."""

    def __init__(self, name: str, duration: float, shown: bool):
        from tqdm import tqdm

        self.bar = tqdm(
            total=round(duration, 1),
            unit="s",
            desc=name,
            leave=False,
            disable=not shown,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.1f}/{total:.1f} s [{elapsed}<{remaining}]",
        )

    def segment(self, seg) -> None:
        self.bar.update(max(0.0, min(self.bar.total, round(seg.end, 1)) - self.bar.n))

    def close(self) -> None:
        self.bar.update(self.bar.total - self.bar.n)
        self.bar.close()


def run(args):
    from speechrt.errors import UserError

    files = list(args.file)
    if args.sample:
        files.append(str(sample_path()))
    if not files:
        raise UserError("no audio file given (FILE ..., or --sample for the bundled recording)")
    from speechrt.models.audio import SAMPLE_RATE, load_audio
    from speechrt.pipelines.asr import TranscribeOptions, load_asr
    from speechrt.pipelines.formats import EXTENSIONS, render

    fmt = output_format(args)
    opts = dict(
        beam_size=args.beam_size,
        language=args.language,
        task=args.task,
        initial_prompt=args.initial_prompt,
        without_timestamps=args.no_timestamps,
        word_timestamps=args.word_timestamps,
        silence_level_db=args.silence_level_db,
        **vad_options(args),
    )
    if args.whole_windows:
        opts["trim_context"] = False
    if args.temperature is not None:
        opts["temperatures"] = (args.temperature,)
    TranscribeOptions(**opts)  # the options and the files are checked before the model loads
    audios = [load_audio(f) for f in files]
    out_dir = Path(args.output_dir) if args.output_dir else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    asr = load_asr(args.model, args.backend, args.device, args.dtype)
    # segments (and their words) printed as they are decoded
    live = (args.segments or (args.word_timestamps and not args.json and not args.format)) and out_dir is None

    def show(seg):
        print(f"[{_ts(seg.start)} --> {_ts(seg.end)}] {seg.text.strip()}", flush=True)
        for w in seg.words:
            print(f"    {_ts(w.start)} {_ts(w.end)}  {w.probability:.2f}  {w.word.strip()}", flush=True)

    for i, (name, audio) in enumerate(zip(files, audios)):
        duration = len(audio) / SAMPLE_RATE
        bar = Progress(Path(name).name, duration, args.progress or (duration > 30 and sys.stderr.isatty()))

        def on_segment(seg, bar=bar):
            bar.segment(seg)
            if live:
                show(seg)

        if len(files) > 1 and out_dir is None:
            print(f"{'' if i == 0 else chr(10)}==> {name} <==", flush=True)
        languages = asr.detect_language(audio, k=5) if args.detect_language else None
        if languages and fmt != "verbose_json" and out_dir is None:
            print("".join(f"{code:4} {prob:.3f}\n" for code, prob in languages), flush=True)
        result = asr.transcribe(audio, on_segment=on_segment, **opts)
        bar.close()
        if live:
            continue
        text = render(result, fmt, args.task)
        if languages and fmt == "verbose_json":  # the candidates beside the detected language and its probability
            text = json.dumps(
                {**json.loads(text), "language_candidates": [[c, round(p, 4)] for c, p in languages]},
                ensure_ascii=False,
            )
        if out_dir is not None:
            path = out_dir / f"{Path(name).stem}.{EXTENSIONS[fmt]}"
            path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf-8")
            print(f"{name} -> {path}", file=sys.stderr)
        else:
            print(text, end="" if text.endswith("\n") else "\n", flush=True)
    return 0
