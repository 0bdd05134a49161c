"""Benchmark CLI tests: real `speechrt bench` runs on the embedded models, small enough for CI (a short
sentence, few repeats), in their own processes as a user runs them."""
from __future__ import annotations

import subprocess
import sys

import pytest


def run_bench(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "speechrt", "bench", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="session")
def bench():
    """`bench(*args)`: `speechrt bench ARGS` in its own process -> CompletedProcess."""
    return run_bench


def measure_tts_pair(d) -> list:
    """Two runs of the same commit, one after the other: `bench tts` on one sentence, our torch and
    onnxruntime backends and Piper, 5 repeats each, one thread per engine -> [a.json, b.json]. One thread:
    on a CPU shared with other work, two-thread runs swing by tens of percent with the other work's load
    (OpenMP barriers wait for a descheduled thread), one-thread runs by a few percent."""
    out = []
    for name in ("a", "b"):
        path = d / f"{name}.json"
        r = run_bench("tts", "--backends", "torch,onnxruntime", "--repeats", "5", "--threads", "1", "--text",
                      "The weather is nice today.", "--json", path)
        assert r.returncode == 0, r.stderr
        out.append(path)
    return out


@pytest.fixture(scope="session")
def tts_pair():
    """`tts_pair(folder)`: measure a pair of runs (measure_tts_pair)."""
    return measure_tts_pair


@pytest.fixture(scope="session")
def tts_runs(tmp_path_factory):
    return measure_tts_pair(tmp_path_factory.mktemp("tts-runs"))
