"""`bench server`'s results: a level's latency percentiles, word error rate and bounds, the printed table row,
the result records of a sweep, and the long turns' (--long-turn, --long-turn-speech)."""

from __future__ import annotations

import asyncio

from speechrt.bench.record import Record, Repeats, Results, percentile
from speechrt.bench.server_engines import http_base
from speechrt.bench.server_load import LOAD, counters
from speechrt.bench.server_streams import SENTENCES, dense_recording, long_level, long_recording, recordings
from speechrt.models.wer import wer

KEYS = ("partial", "final", "first_audio", "v2v")  # latencies per utterance; the last two in conversations
BOUND_S = 1.0  # the p95 final-transcript latency a level must keep
# issue 14's capacity: besides p95 final <= BOUND_S, live text p50 <= 1 s and WER within 1 point of the same
# utterances spoken alone
LIVE_BOUND_S = 1.0
WER_SLACK = 0.01


def summary(n, results, conversation, alone: dict | None = None) -> dict:
    """One level: p50/p95 of each latency over its utterances (None where none had it), the utterances
    that got no final transcript, the word error rate, and (given `alone`, the single-stream level's row) the
    word error rate of the same utterances spoken alone; how many utterances' live deltas did not add up to
    their final transcript (words sent live that the final transcript does not begin with)."""
    row = {"streams": n, "utterances": len(results), "lost": sum("final" not in r for r in results)}
    row["refused"] = len({r["stream"] for r in results if "refused" in r})  # sessions refused or never connected
    for key in KEYS if conversation else KEYS[:2]:
        xs = [r[key] for r in results if key in r]
        row[key] = {
            "p50": percentile(xs, 0.5) if xs else None,
            "p95": percentile(xs, 0.95) if xs else None,
            "samples": xs,
        }
    row["pairs"] = [(r["text"], r.get("transcript", "")) for r in results]
    refs = [t for t, _ in row["pairs"]]
    row["wer"] = wer(refs, [h for _, h in row["pairs"]])
    heard = dict(alone["pairs"]) if alone else {}
    if alone and all(t in heard for t in refs):
        row["wer_alone"] = wer(refs, [heard[t] for t in refs])
    row["live_inconsistent"] = sum(r.get("live_consistent") is False for r in results)
    row["ok"] = row["lost"] == 0 and row["final"]["p95"] is not None and row["final"]["p95"] <= BOUND_S
    live = row["partial"]["p50"]  # None where the server sent no live text (--partial-interval 0)
    row["meets"] = (
        row["ok"]
        and (live is None or live <= LIVE_BOUND_S)
        and row["wer"] <= row.get("wer_alone", row["wer"]) + WER_SLACK
    )
    return row


def print_row(name, row, conversation):
    def f(d):
        return " ".join(f"{1000 * d[q]:7.0f}" if d[q] is not None else f"{'-':>7}" for q in ("p50", "p95"))

    line = f"{name:14} {row['streams']:7d} {f(row['partial'])}  {f(row['final'])}"
    if conversation:
        line += f"  {f(row['first_audio'])}  {f(row['v2v'])}"
    lost = f"  ({row['lost']} without a final)" if row["lost"] else ""
    alone = f" (alone {100 * row['wer_alone']:.1f}%)" if "wer_alone" in row and row["streams"] > 1 else ""
    live = f"  {row['live_inconsistent']} with live text unlike the final" if row.get("live_inconsistent") else ""
    loaded = f"  {row['loaded_margin']} finals with the loaded margin" if row.get("loaded_margin") else ""
    if row.get("refused"):
        lost += f"  ({row['refused']} sessions refused or not connected)"
    load = load_text(row)
    print(
        line + f"  {100 * row['wer']:5.1f}%" + alone + lost + live + loaded + (f"  ({load})" if load else ""),
        flush=True,
    )


def load_text(row) -> str:
    """A level's load in words: "server 1.20 cores, engine busy 45% (workers 40%, 50%), VAD 0.20 cores, GPU none,
    host 1.60 cores, clients 0.30 cores, busiest client 12% in 2 client processes"."""
    parts = []
    for k, what, fmt in LOAD:
        if k in row:
            parts.append(f"{what} {'none' if row[k] is None else fmt.format(row[k])}")
            if k == "engine_busy" and row.get("engine_busy_workers"):
                parts[-1] += " (workers " + ", ".join(f"{v:.0%}" for v in row["engine_busy_workers"].values()) + ")"
            elif k == "engine_busy" and row.get("engine_busy_families"):
                parts[-1] += " (" + ", ".join(f"{f} {v:.0%}" for f, v in row["engine_busy_families"].items()) + ")"
    text = ", ".join(parts)
    if "client_processes" in row:
        text += f" in {row['client_processes']} client process" + ("es" if row["client_processes"] > 1 else "")
    return text


def records(engine, mode, rows, peer_label, levels) -> list[Record]:
    from speechrt.models.registry import resolve

    model = resolve(None, "asr").name
    out = []
    for row in rows:
        n = row["streams"]
        common = dict(
            family="server",
            model=model,
            engine=engine.name,
            backend=engine.backend,
            precision=engine.precision,
            device=engine.device,
            workload=f"{mode}, {n} streams",
            peer=peer_label if engine.name == "speechrt" else "",
            params={"streams": n, "mode": mode, "utterances": row["utterances"], "lost": row["lost"]},
        )
        for key, d in row.items():
            if key not in KEYS or d["p50"] is None:
                continue
            rep = Repeats.of(d["samples"])
            out += [
                Record(metric=f"{key}_{q}_s", unit="s", value=d[q], better="lower", repeats=rep, **common)
                for q in ("p50", "p95")
            ]
        out.append(Record(metric="wer", unit="%", value=100 * row["wer"], better="", **common))
        if "wer_alone" in row:
            out.append(
                Record(metric="wer_same_utterances_alone", unit="%", value=100 * row["wer_alone"], better="", **common)
            )
        out.append(
            Record(
                metric="live_text_unlike_final",
                unit="utterances",
                value=row["live_inconsistent"],
                better="lower",
                **common,
            )
        )
        if "loaded_margin" in row:
            out.append(
                Record(
                    metric="finals_with_loaded_margin",
                    unit="transcripts",
                    value=row["loaded_margin"],
                    better="",
                    **common,
                )
            )
        out += [
            Record(metric=metric, unit=unit, value=row[k], better="", **common)
            for k, metric, unit in (
                ("server_cpu_cores", "server_cpu_cores", "cores"),
                ("engine_busy", "engine_busy_fraction", "fraction"),
                ("vad_cores", "vad_cores", "cores"),
                ("gpu_busy", "gpu_busy_fraction", "fraction"),  # None (no record) where no GPU was sampled
                ("client_processes", "client_processes", "processes"),
                ("client_cpu_cores", "client_cpu_cores", "cores"),
                ("client_cpu_share", "client_cpu_busiest_fraction", "fraction"),
                ("host_cpu_cores", "host_cpu_cores", "cores"),
            )
            if row.get(k) is not None
        ]
        out += [
            Record(
                metric="engine_busy_fraction",
                unit="fraction",
                value=v,
                better="",
                **{
                    **common,
                    "workload": f"{common['workload']}, worker {w}",
                    "params": {**common["params"], "worker": w},
                },
            )
            for w, v in row.get("engine_busy_workers", {}).items()
        ]
        out += [
            Record(
                metric="engine_family_busy_fraction",  # (one engine's worker threads: asr, lm, tts)
                unit="fraction",
                value=v,
                better="",
                **{**common, "workload": f"{common['workload']}, {f}", "params": {**common["params"], "family": f}},
            )
            for f, v in row.get("engine_busy_families", {}).items()
        ]
    for metric, key in (("max_streams_p95_final_le_1s", "ok"), ("max_streams_meeting_targets", "meets")):
        if rows:
            out.append(
                Record(
                    family="server",
                    model=model,
                    engine=engine.name,
                    backend=engine.backend,
                    precision=engine.precision,
                    device=engine.device,
                    workload=f"{mode} sweep {','.join(map(str, levels))}",
                    metric=metric,
                    unit="streams",
                    value=max([r["streams"] for r in rows if r[key]], default=0),
                    better="higher",
                    peer=peer_label if engine.name == "speechrt" else "",
                    params={"mode": mode},
                )
            )
    return out


def long_turn(engine, recs, args, out: Results) -> None:
    """--long-turn: for each kind of speech (--long-turn-speech), the long turn's final latency and WER and the
    other session's finals (p50, p95, the longest), printed and recorded."""
    kinds = ["paced", "dense"] if args.long_turn_speech == "both" else [args.long_turn_speech]
    for kind in kinds:
        # every sentence once before any repeats (a text that loops would be cut as a decoding loop)
        long_rec = (
            long_recording(recordings(SENTENCES), args.long_turn)
            if kind == "paced"
            else dense_recording(args.long_turn)
        )
        long_turn_of(engine, recs, args, out, kind, long_rec)


def long_turn_of(engine, recs, args, out: Results, kind: str, long_rec) -> None:
    from speechrt.models.registry import resolve

    r, others = asyncio.run(long_level(engine.url, recs, long_rec, args))
    row = summary(1, others, False)
    # the audio not committed that its final transcribed (the server's gauge: the last final of a long turn)
    rest = counters(http_base(engine.url), ("asr_long_final_rest_seconds",)).get("asr_long_final_rest_seconds")
    seconds = long_rec[3] - long_rec[2]
    wpm = len(long_rec[0].split()) / seconds * 60
    finals = row["final"]["samples"]
    print(
        f"long turn ({kind}, {wpm:.0f} words a minute): {seconds:.1f} s without a pause beside 1 stream: final "
        + (
            f"{1000 * r['final']:.0f} ms after its speech ended, WER {100 * wer(r['text'], r['transcript']):.1f}%"
            if "final" in r
            else "never came"
        )
        + (f" (its final transcribed {rest:.1f} s not committed)" if rest else "")
        + (f"; the other stream's longest final {1000 * max(finals):.0f} ms" if finals else "")
        + "; the other stream:"
    )
    print_row(engine.name, row, False)
    what = "" if kind == "paced" else "dense "
    common = dict(
        family="server",
        model=resolve(None, "asr").name,
        engine=engine.name,
        backend=engine.backend,
        precision=engine.precision,
        device=engine.device,
        workload=f"{what}long turn {seconds:.0f} s beside 1 stream",
        params={
            "long_turn_s": round(seconds, 1),
            "speech": kind,
            "words_per_minute": round(wpm),
            "utterances": row["utterances"],
            "lost": row["lost"],
        },
    )
    if "final" in r:
        out.records += [
            Record(metric="long_turn_final_s", unit="s", value=r["final"], better="lower", **common),
            Record(metric="long_turn_wer", unit="%", value=100 * wer(r["text"], r["transcript"]), better="", **common),
        ]
        if rest:
            out.records.append(Record(metric="long_turn_final_rest_s", unit="s", value=rest, better="lower", **common))
    if row["final"]["p95"] is not None:
        out.records += [
            Record(
                metric=f"final_{q}_s",
                unit="s",
                value=row["final"][q],
                better="lower",
                repeats=Repeats.of(finals),
                **common,
            )
            for q in ("p50", "p95")
        ]
        out.records.append(Record(metric="final_max_s", unit="s", value=max(finals), better="lower", **common))
