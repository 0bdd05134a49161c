"""`python -m benchmarks.opening_study`: the streaming server's opening rounds (a turn's first live words,
streaming/realtime/turn_transcripts.py) with their decode capped at OPENING_TOKENS tokens against uncapped —
time a round and the word each would send — on the benchmark's utterances in the embedded voice
(margin_study.clips, the middle lead silence), cut where opening rounds run: 0.6-1.5 s of speech after the lead.

    python -m benchmarks.opening_study [--caps 4,5] [--config onnxruntime:int8] [--threads 2]

An opening round sends the first word of a hypothesis of two words or more (Turn.agree); what the decoder says
after that word is only checked again by the next round, which takes it as its draft. Capped and uncapped rounds
are timed alternately, in the order flipped each clip."""

from __future__ import annotations

import argparse
import dataclasses
import time

from benchmarks import margin_study

SPEECH_S = (0.6, 0.9, 1.2, 1.5)  # speech heard when the round runs (opening rounds come 0.3 s apart)


def study(asr, data, caps: list[int | None], lead_s: float) -> list[dict]:
    """Per cap (None: uncapped): ms a round over `data` cut at each SPEECH_S after `lead_s`, how many rounds
    would send a first word, how many send the uncapped round's, and how many stopped at the cap."""
    from speechrt.streaming.asr_options import asr_options
    from speechrt.streaming.realtime.config import SessionConfig

    live = asr_options(SessionConfig(), live=True)
    opts = {c: live if c is None else dataclasses.replace(live, sample_len=c) for c in caps}
    rows = {c: {"cap": c, "seconds": 0.0, "sends": 0, "same": 0, "cut": 0} for c in caps}
    rounds = [a[: int((lead_s + s) * margin_study.RATE)] for s in SPEECH_S for _, a in data]
    for i, audio in enumerate(rounds):
        words = {}
        for c in caps if i % 2 else caps[::-1]:
            t0 = time.perf_counter()
            r = asr.transcribe_batch([audio], opts[c])[0]
            rows[c]["seconds"] += time.perf_counter() - t0
            w = r.text.split()
            words[c] = w[0] if len(w) >= 2 else None
            rows[c]["cut"] += c is not None and len(r.tokens) >= c
        for c in caps:
            rows[c]["sends"] += words[c] is not None
            rows[c]["same"] += words[c] == words[None]
    for r in rows.values():
        r["ms"] = 1e3 * r.pop("seconds") / len(rounds)
        r["rounds"] = len(rounds)
    return list(rows.values())


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.opening_study", description=__doc__.split("\n\n")[0])
    ap.add_argument("--caps", default="4,5", help="token caps to try (comma-separated)")
    margin_study.add_asr_args(ap)
    args = ap.parse_args(argv)

    from speechrt.bench.fingerprint import fingerprint

    lead = margin_study.SILENCES[1]
    data = [
        c
        for i, c in enumerate(margin_study.clips(args.seeds))
        if margin_study.SILENCES[i % len(margin_study.SILENCES)] == lead
    ]
    asr, config = margin_study.load_asr(args)
    for _ in range(3):  # the first calls pay for thread pools and allocations
        asr.transcribe_batch([data[0][1]])
    rows = study(asr, data, [None] + [int(c) for c in args.caps.split(",")], lead[0])
    print(
        f"{rows[0]['rounds']} opening rounds ({len(data)} clips x {len(SPEECH_S)} cuts), {config}, "
        f"{fingerprint()['label']}"
    )
    for r in rows:
        name = "uncapped" if r["cap"] is None else f"cap {r['cap']} tokens"
        print(
            f"{name:16s} {r['ms']:6.1f} ms a round   sends a first word {r['sends']}   the uncapped round's "
            f"{r['same']}   stopped at the cap {r['cut']}"
        )


if __name__ == "__main__":
    main()
