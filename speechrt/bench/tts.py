"""`speechrt bench tts`: real-time factor and time to first audio of our synthesis (per backend) and of
Piper's own (`piper-tts`, same voice file, same text, same thread count), in one process, with ratios.

Engines run interleaved (one repetition of each in turn), so a change in machine load hits all of them, and no
engine ever runs twice in a row (turns()): in one process a synthesis that follows another of the same text ran
~20 % faster (5 words, AMD EPYC Zen 4), so an order in which some engine follows itself favours it. And each
run starts PAUSE_S after the one before: ONNX Runtime's pool threads spin for a while after a run (Piper's
session spins, its default), and on two cores they took a core from whatever ran next: our 5-word synthesis
took 104 ms right after Piper's, 95 ms 20 ms later, 90 ms 100 ms later, 87 ms right after our own (Zen 4,
medians of 20).
Time to first audio runs from the call (text in) to the first chunk of audio out; the real-time factor is
the time to produce all of a sentence's audio over its duration.
"""

from __future__ import annotations

import statistics
import time

from speechrt.bench.fingerprint import usable_cores
from speechrt.cli_paths import output_file

PAUSE_S = 0.1  # between two timed runs (see the module docstring)
SENTENCES = {
    "short": "The weather is nice today.",  # 5 words
    "long": (
        "When the morning train finally pulled into the quiet station, the travelers gathered their heavy "
        "bags and walked slowly toward the old wooden bridge that crossed the wide muddy river."
    ),  # 30 words
    # four sentences in one call: the ones after the first are vocoded for throughput (pipelines.tts.relaxed)
    "paragraph": (
        "The station was quiet in the early morning. A few travelers waited on the platform with their bags. "
        "When the train finally arrived, everyone hurried toward the doors. The conductor smiled and checked "
        "each ticket."
    ),  # 35 words
}


def add_arguments(p):
    p.add_argument("--voice", default=None, help="voice name or Piper .onnx path (default: the embedded voice)")
    p.add_argument(
        "--backends",
        default="torch,onnxruntime",
        help="comma list of our backends (auto: the one `--backend auto` picks here) (default: %(default)s)",
    )
    p.add_argument(
        "--export",
        default=None,
        help="also time the onnxruntime backend on this `speechrt export tts` "
        "directory (our torch VITS exported in pieces)",
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for every engine (default: all cores)")
    p.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed runs per engine and sentence after a warm-up (median) (default: %(default)s)",
    )
    p.add_argument("--text", action="append", default=None, help="benchmark this text instead (repeatable)")
    p.add_argument("--no-peer", action="store_true", help="skip Piper")
    p.add_argument(
        "--json",
        default=None,
        type=output_file("--json", "results.json"),
        help="also write the results (speechrt.bench.record schema) to this file",
    )


class _Ours:
    def __init__(self, backend, voice, device):
        from speechrt.pipelines.tts import load_tts

        self.tts = load_tts(voice, backend, device)
        self.name = f"speechrt {self.tts.info.backend}" + (" (auto)" if backend == "auto" else "")
        self.sample_rate = self.tts.sample_rate
        info = self.tts.info
        self.engine, self.backend, self.precision, self.device = "speechrt", info.backend, info.precision, info.device

    def run(self, text):
        t0 = time.perf_counter()
        first, n = None, 0
        for chunk in self.tts.synthesize(text):
            if first is None:
                first = time.perf_counter() - t0
            n += len(chunk)
        return first, time.perf_counter() - t0, n / self.sample_rate

    def ids(self, text):
        return list(self.tts.text.sentences(text))


class _Piper:
    name = "piper-tts"
    engine, backend, precision, device = "piper-tts", "onnxruntime", "float32", "cpu"

    def __init__(self, path, threads):
        import onnxruntime
        from piper import PiperVoice

        self.voice = PiperVoice.load(str(path))
        self.sample_rate = self.voice.config.sample_rate
        if threads:  # same thread count as ours: rebuild its session with it
            so = onnxruntime.SessionOptions()
            so.intra_op_num_threads = threads
            self.voice.session = onnxruntime.InferenceSession(
                str(path), sess_options=so, providers=["CPUExecutionProvider"]
            )

    def run(self, text):
        t0 = time.perf_counter()
        first, n = None, 0
        for chunk in self.voice.synthesize(text):
            if first is None:
                first = time.perf_counter() - t0
            n += len(chunk.audio_float_array)
        return first, time.perf_counter() - t0, n / self.sample_rate

    def ids(self, text):
        return [self.voice.phonemes_to_ids(p) for p in self.voice.phonemize(text) if p]


def turns(engines: list, i: int) -> list:
    """The engines' order in round i: no engine follows itself, within a round or across two, and each runs in
    each place equally often (rotations; two engines alternate). Reversing every round, the earlier order,
    ran the first and last engines twice in a row at each turn of the order and never the middle ones: with
    three, the middle one lost the ~20 % that a repeat of the same text gains (see the module docstring)."""
    if len(engines) < 3:
        return list(engines)
    k = i % len(engines)
    return list(engines[k:]) + list(engines[:k])


def run(args):
    import torch

    from speechrt.models.registry import resolve

    threads = args.threads or usable_cores()
    torch.set_num_threads(threads)
    model = resolve(args.voice, "tts")
    texts = {f"text{i + 1}": t for i, t in enumerate(args.text)} if args.text else dict(SENTENCES)
    engines = [_Ours(b.strip(), args.voice, args.device) for b in args.backends.split(",") if b.strip()]
    if args.export:
        engines.append(_Ours("onnxruntime", args.export, args.device))
        engines[-1].name = "speechrt ort (export)"
    if not args.no_peer:
        try:
            engines.append(_Piper(model.path, threads))
        except ImportError:
            print("(piper-tts not installed: pip install 'speechrt[peers]' to compare with Piper)")
    print(
        f"voice: {model.name}; threads: {threads}; torch {torch.__version__}; device: {args.device}; "
        f"repeats: {args.repeats} (median)"
    )
    peer = next((e for e in engines if isinstance(e, _Piper)), None)
    if peer is not None:
        same = all(engines[0].ids(t) == peer.ids(t) for t in texts.values())
        print(f"phoneme ids identical to Piper's for these texts: {'yes' if same else 'NO'}")

    results = {}
    for key, text in texts.items():
        for e in engines:
            e.run(text)  # warm-up
        runs = {e.name: [] for e in engines}
        for i in range(args.repeats):
            for e in turns(engines, i):
                time.sleep(PAUSE_S)
                runs[e.name].append(e.run(text))
        for e in engines:
            r = runs[e.name]
            first = statistics.median(x[0] for x in r)
            total = statistics.median(x[1] for x in r)
            audio = statistics.median(x[2] for x in r)
            results[(key, e.name)] = {
                "sentence": key,
                "words": len(text.split()),
                "engine": e.name,
                "audio_s": audio,
                "synth_s": total,
                "rtf": total / audio,
                "first_audio_s": first,
                "runs": r,
                "of": e,
            }

    hdr = f"{'sentence':15} {'engine':22} {'audio s':>8} {'synth s':>8} {'RTF':>7} {'first audio s':>14}"
    if peer is not None:
        hdr += f" {'RTF / Piper':>12} {'first / Piper':>14}"
    print(hdr)
    for key in texts:
        for e in engines:
            r = results[(key, e.name)]
            line = (
                f"{key + ' (' + str(r['words']) + 'w)':15} {e.name:22} {r['audio_s']:8.2f} {r['synth_s']:8.3f} "
                f"{r['rtf']:7.3f} {r['first_audio_s']:14.3f}"
            )
            if peer is not None:
                p = results[(key, peer.name)]
                r["rtf_ratio"] = r["rtf"] / p["rtf"]
                r["first_audio_ratio"] = r["first_audio_s"] / p["first_audio_s"]
                line += f" {r['rtf_ratio']:12.2f} {r['first_audio_ratio']:14.2f}"
            print(line)
    if args.json:
        from speechrt.bench.record import Results

        Results(_records(results.values(), model.name, threads, peer)).write(args.json)
    return 0


def _records(rows, model, threads, peer):
    """Per sentence and engine: the real-time factor and the time to first audio, each with its repeats (and
    their rounds, in order); ours compared with Piper."""
    from speechrt.bench.record import Record, Repeats

    out = []
    for r in rows:
        e = r["of"]
        common = dict(
            family="tts",
            model=model,
            engine=e.engine,
            backend=e.backend,
            precision=e.precision,
            device=e.device,
            workload=f"{r['sentence']} ({r['words']} words)",
            peer=f"{peer.engine} {peer.precision}" if peer is not None and e is not peer else "",
            params={"threads": threads, "words": r["words"], "audio_s": r["audio_s"]},
        )
        out.append(
            Record(
                metric="rtf",
                unit="x",
                value=r["rtf"],
                better="lower",
                repeats=Repeats.of((x[1] / x[2] for x in r["runs"]), rounds=True),
                **common,
            )
        )
        out.append(
            Record(
                metric="first_audio_s",
                unit="s",
                value=r["first_audio_s"],
                better="lower",
                repeats=Repeats.of((x[0] for x in r["runs"]), rounds=True),
                **common,
            )
        )
    return out
