"""Long-form transcription with the last window trimmed to its audio, against whole 30-s windows: WER and time
on long recordings the embedded voice speaks (six paragraphs, in pairs and alone, at three speaking rates) and
the bundled passage.

    python -m benchmarks.trim_study [--margins 1,2,3,5]
        [--configs onnxruntime:int8,onnxruntime:float32,torch:float32]

A long recording's last window usually holds a few seconds of audio, yet a whole window costs a full 30-s
encoder pass; `trim_context` encodes that window's audio and `trim_margin` seconds of the padding after it.
This prints, per backend and precision, each margin's total WER over the recordings next to the whole
windows', the recordings whose text changed, and the summed transcription time."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

PARAGRAPHS = [
    "The city library opened a new reading room last spring. It has tall windows facing the park, long oak "
    "tables and a quiet corner for children. On weekday mornings retired teachers read stories aloud, and on "
    "Saturdays a volunteer helps visitors find old newspapers and maps. The librarians say that more people "
    "come in now than at any time in the last ten years. Some of them come to study, some to use the "
    "computers, and some simply to sit in the sun with a book. In the evening the lights stay on until nine, "
    "and the last visitors leave through the garden gate.",
    "My grandmother kept a small garden behind her house. Every April she planted tomatoes, beans and "
    "peppers in straight rows, and marked each row with a painted stick. She watered the plants early in the "
    "morning, before the heat of the day, and she talked to them while she worked. By the middle of summer "
    "the kitchen was full of baskets, and the neighbors went home with bags of vegetables. When autumn came "
    "she saved the seeds in paper envelopes, wrote the year on each one, and stored them in a tin box in "
    "the cellar. We still have that box today.",
    "The train to the mountains leaves the station at a quarter past eight. For the first hour it runs "
    "through farmland, past wide fields of wheat and small villages with white churches. Then the valley "
    "narrows and the track begins to climb. The train crosses a stone bridge above a river, passes through "
    "six short tunnels and stops at a station where the air is suddenly cold. Most passengers get off there "
    "to walk the trails around the lake. Others stay on until the end of the line, where a small hotel "
    "serves hot soup and fresh bread to anyone who arrives before noon. The last train back leaves at six.",
    "Our team meets every Monday to plan the week. We start by looking at what was finished and what is still "
    "open, and then each person says what they will work on next. If two people need the same machine, we "
    "decide who goes first. The meeting should take thirty minutes, but it often runs longer when someone "
    "brings a difficult problem. Last week we spent almost an hour on a bug that only appeared on Fridays. "
    "In the end it turned out to be a clock that was set to the wrong time zone. Everyone laughed, fixed "
    "the setting, and went back to work.",
    "Bees visit thousands of flowers in a single day. They carry pollen from one plant to the next, and "
    "without them many fruits and nuts would never grow. A healthy hive can hold fifty thousand bees in the "
    "middle of summer. The queen lays the eggs, the workers build the wax cells and gather food, and the "
    "drones have only one task. In cold weather the bees cluster together in the center of the hive and "
    "shiver to keep warm. Beekeepers check their hives every few weeks, looking for signs of disease and "
    "making sure there is enough honey to last the winter.",
    "The museum on the hill holds a collection of old clocks and watches. Some are no bigger than a coin, "
    "and one is taller than a man. The oldest was built more than three hundred years ago, and it still "
    "keeps good time. Every hour the room fills with the sound of bells, chimes and small wooden birds. "
    "The guide explains how the springs and gears work, and visitors can watch a clock maker repair a "
    "broken watch at his bench by the window. At the end of the tour there is a shop that sells books, "
    "postcards and simple kits for building a clock at home. Children especially love the cuckoo clocks.",
]


def recordings() -> list[tuple[str, np.ndarray, str]]:
    """(name, 16-kHz float32 audio, reference text): the bundled passage; every two consecutive paragraphs
    spoken by the embedded voice at rates 1 and 1.25 (61-65 s and 54-58 s: three windows) and each paragraph
    alone at rate 0.8 (34-38 s: two). The voice's own noise, seeded: the same audio every run."""
    import speechrt
    from speechrt.models.audio import SAMPLE_RATE, load_audio
    from speechrt.pipelines.tts import load_tts

    data = Path(speechrt.__file__).parent / "data"
    out = [("passage", load_audio(data / "passage.flac"), (data / "passage.txt").read_text())]
    tts = load_tts()
    n = len(PARAGRAPHS)
    texts = [
        (f"p{i}+p{(i + 1) % n}@{rate}", PARAGRAPHS[i] + " " + PARAGRAPHS[(i + 1) % n], rate)
        for rate in (1.0, 1.25)
        for i in range(n)
    ]
    texts += [(f"p{i}@0.8", text, 0.8) for i, text in enumerate(PARAGRAPHS)]
    for k, (name, text, rate) in enumerate(texts):
        o = tts.options(rate=rate, seed=k, sentence_silence=0.25)
        out.append((name, tts.synthesize_array(text, o, sample_rate=SAMPLE_RATE).astype(np.float32), text))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--margins", default="1,2,3,5", help="trim margins to try, seconds (comma-separated)")
    ap.add_argument(
        "--configs",
        default="onnxruntime:int8,onnxruntime:float32,torch:float32",
        help="backend:dtype pairs (comma-separated)",
    )
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    import torch

    from speechrt.models.audio import SAMPLE_RATE
    from speechrt.models.wer import wer
    from speechrt.pipelines.asr import load_asr

    torch.set_num_threads(args.threads)
    recs = recordings()
    print("recordings:", ", ".join(f"{n} {len(a) / SAMPLE_RATE:.1f} s" for n, a, _ in recs), flush=True)
    margins = [float(m) for m in args.margins.split(",")]
    for config in args.configs.split(","):
        backend, dtype = config.split(":")
        asr = load_asr(None, backend, "cpu", dtype)
        asr.transcribe(recs[0][1][: 5 * SAMPLE_RATE], SAMPLE_RATE)  # warm-up
        rows = {}
        runs = [("whole", {"trim_context": False})]  # faster-whisper's windows (trimming is the default)
        runs += [(f"trim {m:g} s", {"trim_context": True, "trim_margin": m}) for m in margins]
        for label, kw in runs:
            texts, seconds = [], 0.0
            for _, audio, _ in recs:
                t = time.perf_counter()
                texts.append(asr.transcribe(audio, SAMPLE_RATE, **kw).text)
                seconds += time.perf_counter() - t
            rows[label] = (texts, seconds)
        whole = rows["whole"][0]
        refs = " ".join(r for _, _, r in recs)
        for label, (texts, seconds) in rows.items():
            changed = [n for (n, _, _), a, b in zip(recs, texts, whole) if a != b]
            per = [100 * wer(r, t) for (_, _, r), t in zip(recs, texts)]
            print(
                f"{backend} {dtype:8s} {label:10s} WER {100 * wer(refs, ' '.join(texts)):5.2f} % "
                f"(worst {max(per):5.2f} %)  {seconds:6.2f} s  changed: {', '.join(changed) or '-'}",
                flush=True,
            )
        for label, (texts, _) in rows.items():
            for (n, _, _r), a, b in zip(recs, texts, whole):
                if a != b:
                    print(
                        f"  {label} {n}: whole ...{b[-160:]!r}\n  {' ' * len(label)} {' ' * len(n)}  trim  "
                        f"...{a[-160:]!r}"
                    )


if __name__ == "__main__":
    main()
