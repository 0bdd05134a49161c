"""Benchmark CLI tests: real `speechrt bench` runs on the embedded models, small enough for CI (a short
sentence, few repeats), in their own processes as a user runs them."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from speechrt.bench.record import Record, Repeats, load


def run_bench(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "speechrt", "bench", *map(str, args)], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="session")
def bench():
    """`bench(*args)`: `speechrt bench ARGS` in its own process -> CompletedProcess."""
    return run_bench


def measure_tts_pair(d) -> list:
    """Two runs of the same commit, interleaved: one `bench tts` on one sentence, our torch and onnxruntime
    backends and Piper, one thread per engine, 16 rounds (in each round every engine runs once), written as
    its even rounds (a.json) and its odd rounds (b.json) -> [a.json, b.json]. Two runs one after the other
    differ by whatever load the machine's other work put on each (CI's shared 2-core host: 10-25 % for a
    whole run), which no rule can tell from a regression; interleaved, both halves see the same load and
    differ by the noise within a run, which is what compare's rule has to tolerate. One thread: on a shared
    CPU, two-thread runs swing by tens of percent with the other work's load (OpenMP barriers wait for a
    descheduled thread), one-thread runs by a few percent."""
    whole = d / "whole.json"
    r = run_bench(
        "tts",
        "--backends",
        "torch,onnxruntime",
        "--repeats",
        "16",
        "--threads",
        "1",
        "--text",
        "The weather is nice today.",
        "--json",
        whole,
    )
    assert r.returncode == 0, r.stderr
    res = load(whole)
    out = []
    for name, first in (("a", 0), ("b", 1)):
        half = dataclasses.replace(res, records=[_rounds(x, first) for x in res.records])
        half.write(d / f"{name}.json", machine=res.machine)
        out.append(d / f"{name}.json")
    return out


def _rounds(rec: Record, first: int) -> Record:
    """`rec` as measured in every other round, from round `first` on."""
    assert rec.repeats is not None and rec.repeats.rounds is not None, f"{rec.label} {rec.metric} kept no rounds"
    rep = Repeats.of(rec.repeats.rounds[first::2], rounds=True)
    return dataclasses.replace(rec, value=rep.median, repeats=rep)


@pytest.fixture(scope="session")
def tts_pair():
    """`tts_pair(folder)`: measure a pair of interleaved runs (measure_tts_pair)."""
    return measure_tts_pair


@pytest.fixture(scope="session")
def tts_runs(tmp_path_factory):
    return measure_tts_pair(tmp_path_factory.mktemp("tts-runs"))
