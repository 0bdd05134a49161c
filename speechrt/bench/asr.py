"""`speechrt bench asr`: real-time factor of our Whisper vs faster-whisper (CTranslate2 float32 and int8)
on the same audio, same weights, same thread count, same decoding options, in one process."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from speechrt.bench.fingerprint import usable_cores
from speechrt.cli_paths import output_file


def add_arguments(p):
    p.add_argument("--audio", default=None, help="recording to transcribe (default: the bundled 58-second passage)")
    p.add_argument("--reference", default=None, help="reference transcript (text file) to report word error rates")
    p.add_argument("--model", default=None, help="ASR model name or path (default: whisper-tiny.en)")
    p.add_argument("--backend", default="torch", help="our backend (see --backends) (default: %(default)s)")
    p.add_argument(
        "--backends",
        default=None,
        help="comma list of our backends to time, each at every --dtypes (e.g. torch,onnxruntime; default: --backend)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument(
        "--dtypes",
        default="float32,auto",
        help="comma list of our dtypes to time (default float32,auto; auto = bfloat16 on CPUs with native bf16)",
    )
    p.add_argument("--threads", type=int, default=None, help="CPU threads for every engine (default: all cores)")
    p.add_argument("--beam-size", type=int, default=1)
    p.add_argument(
        "--whole-windows",
        action="store_true",
        help="ours encode every 30-s window whole, as "
        "faster-whisper does (default: a long recording's last window over its audio and 5 s more)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed runs per engine after one warm-up (median reported) (default: %(default)s)",
    )
    p.add_argument(
        "--peers", default="ct2-float32,ct2-int8", help="comma list of peers, or 'none' (default: %(default)s)"
    )
    p.add_argument(
        "--json",
        default=None,
        type=output_file("--json", "results.json"),
        help="also write the results (speechrt.bench.record schema) to this file",
    )


def _time(fn, repeats):
    fn()  # warm-up (allocations, caches, lazy init)
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out, times


def _records(rows, model, device, workload, threads, dur):
    """One rtf record (repeats: each run's time over the audio's) and one WER record per engine; ours are
    compared with the peer of the same precision, else the first peer."""
    from speechrt.bench.record import Record, Repeats

    peers = [r for r in rows if not r["engine"].startswith("speechrt")]
    out = []
    for r in rows:
        ours = r["engine"].startswith("speechrt")
        peer = next((p for p in peers if p["precision"] == r["precision"]), peers[0] if peers else None)
        common = dict(
            family="asr",
            model=model,
            engine="speechrt" if ours else "faster-whisper",
            backend=r["backend"],
            precision=r["precision"],
            device=device,
            workload=workload,
            peer=f"faster-whisper {peer['precision']}" if ours and peer else "",
            params={"threads": threads},
        )
        out.append(
            Record(
                metric="rtf",
                unit="x",
                value=r["rtf"],
                better="lower",
                repeats=Repeats.of(t / dur for t in r["times"]),
                **common,
            )
        )
        if "wer" in r:
            out.append(Record(metric="wer", unit="%", value=100 * r["wer"], better="", **common))
    return out


def run(args):
    import torch

    from speechrt.errors import UserError
    from speechrt.models.audio import SAMPLE_RATE, load_audio
    from speechrt.models.registry import resolve, source_of
    from speechrt.models.wer import wer
    from speechrt.pipelines.asr import load_asr

    data = Path(__file__).resolve().parent.parent / "data"
    audio_path = Path(args.audio) if args.audio else data / "passage.flac"
    ref_path = Path(args.reference) if args.reference else (None if args.audio else data / "passage.txt")
    reference = ref_path.read_text().strip() if ref_path else None
    threads = args.threads or usable_cores()
    torch.set_num_threads(threads)
    audio = load_audio(audio_path)
    dur = len(audio) / SAMPLE_RATE
    print(
        f"audio: {audio_path.name}, {dur:.1f} s; threads: {threads}; beam size: {args.beam_size}; "
        f"torch {torch.__version__}; device: {args.device}; our windows: "
        f"{'whole' if args.whole_windows else 'the last trimmed to its audio + 5 s'}"
    )
    trim = {"trim_context": False} if args.whole_windows else {}
    rows = []

    seen = set()
    ours = [b.strip() for b in (args.backends or args.backend).split(",") if b.strip()]
    for backend in ours:
        for dt in [d.strip() for d in args.dtypes.split(",") if d.strip()]:
            try:
                asr = load_asr(args.model, backend, args.device, dt)
            except UserError as e:  # a dtype one backend has and another has not
                print(f"(speechrt {backend} {dt}: skipped: {e})")
                continue
            precision = asr.info.precision
            name = f"speechrt {asr.info.backend} {precision}"
            if name in seen:  # 'auto' resolved to a dtype already timed
                continue
            seen.add(name)
            t, res, times = _time(
                lambda asr=asr: asr.transcribe(audio, SAMPLE_RATE, beam_size=args.beam_size, **trim), args.repeats
            )
            rows.append(
                {
                    "engine": name,
                    "seconds": t,
                    "rtf": t / dur,
                    "text": res.text,
                    "times": times,
                    "backend": asr.info.backend,
                    "precision": precision,
                    "device": asr.info.device,
                }
            )
            del asr

    peers = [] if args.peers == "none" else [p.strip() for p in args.peers.split(",") if p.strip()]
    model = source_of(resolve(args.model, "asr"))  # an export: the peers run the model it came from
    if peers and model.format != "ct2-whisper":
        print(f"(peers skipped: faster-whisper needs a CTranslate2 model, {model.name} is {model.format})")
        peers = []
    elif peers and not (model.path / "model.bin").exists():
        print(f"(peers skipped: faster-whisper needs one model.bin; {model.name}'s is split into parts)")
        peers = []
    for peer in peers:
        if not peer.startswith("ct2-"):
            print(f"(unknown peer {peer!r}; valid: ct2-float32, ct2-int8, ct2-int8_float32, ...)")
            continue
        try:
            from faster_whisper import WhisperModel
        except ImportError:
            print("(faster-whisper not installed: pip install 'speechrt[peers]' to compare)")
            break
        compute = peer.removeprefix("ct2-")
        fw = WhisperModel(
            str(model.path),
            device="cpu" if args.device == "cpu" else "cuda",
            compute_type=compute,
            cpu_threads=threads,
            num_workers=1,
        )

        def fw_run(fw=fw):
            segs, _ = fw.transcribe(audio, beam_size=args.beam_size, vad_filter=False)
            return "".join(s.text for s in segs).strip()

        t, text, times = _time(fw_run, args.repeats)
        rows.append(
            {
                "engine": f"faster-whisper {compute}",
                "seconds": t,
                "rtf": t / dur,
                "text": text,
                "times": times,
                "backend": "ctranslate2",
                "precision": compute,
            }
        )

    print(f"\n{'engine':34} {'time s':>8} {'RTF':>8}" + (f" {'WER':>6}" if reference else ""))
    for r in rows:
        if reference:
            r["wer"] = wer(reference, r["text"])
        print(
            f"{r['engine']:34} {r['seconds']:8.3f} {r['rtf']:8.4f}" + (f" {100 * r['wer']:5.1f}%" if reference else "")
        )
    ours_rows = [r for r in rows if r["engine"].startswith("speechrt")]
    for o in ours_rows:
        for r in rows:
            if not r["engine"].startswith("speechrt"):
                print(
                    f"{o['engine']} vs {r['engine']}: {r['seconds'] / o['seconds']:.2f}x "
                    f"(their time / ours; >1 means we are faster)"
                )
    if args.json:
        from speechrt.bench.record import Results

        device = next((r["device"] for r in rows if "device" in r), args.device)
        workload = f"{audio_path.name} {dur:.1f} s, beam {args.beam_size}" + (", whole windows" if trim else "")
        Results(_records(rows, model.name, device, workload, threads, dur)).write(args.json)
    return 0
