"""The result schema and the machine fingerprint: what every `--json` file holds."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

import speechrt
from speechrt.bench import fingerprint
from speechrt.bench.record import SCHEMA, Record, Repeats, Results, load
from speechrt.errors import UserError


def _record(**kw) -> Record:
    base = dict(
        family="asr",
        model="m",
        engine="speechrt",
        backend="torch",
        precision="float32",
        device="cpu",
        workload="w",
        metric="rtf",
        unit="x",
        value=0.1,
        better="lower",
    )
    return Record(**{**base, **kw})


def test_record_checks_its_fields():
    with pytest.raises(ValueError, match="unknown family 'speech'; valid: asr, lm, tts, server, kernels, gpu"):
        _record(family="speech")
    with pytest.raises(ValueError, match="finite number"):
        _record(value=float("nan"))
    with pytest.raises(ValueError, match="better must be one of"):
        _record(better="faster")
    assert _record().label == "speechrt torch float32"
    assert _record(engine="faster-whisper", backend="ctranslate2", precision="int8").label == "faster-whisper int8"


def test_write_and_load_round_trip(tmp_path):
    res = Results(
        [
            _record(repeats=Repeats.of([0.12, 0.1, 0.11]), peer="faster-whisper int8", params={"threads": 2}),
            _record(engine="faster-whisper", backend="ctranslate2", precision="int8", value=0.05),
        ]
    )
    res.skip("lm", "llama.cpp", "not installed")
    path = tmp_path / "r.json"
    res.write(path)
    doc = json.loads(path.read_text())
    assert doc["schema"] == SCHEMA and doc["machine"]["cpu"]["logical_cores"] >= 1
    back = load(path)
    assert back.records == res.records and back.skipped == res.skipped
    assert back.records[0].repeats == Repeats(3, 0.1, 0.11, 0.12)
    assert "rounds" not in doc["records"][0]["repeats"]  # kept only where asked for
    assert back.peer_of(back.records[0]) is back.records[1]


def test_rounds_are_kept_in_order(tmp_path):
    rep = Repeats.of([0.12, 0.1, 0.11], rounds=True)
    assert (rep.n, rep.min, rep.median, rep.max, rep.rounds) == (3, 0.1, 0.11, 0.12, (0.12, 0.1, 0.11))
    assert rep.scaled(2).rounds == (0.24, 0.2, 0.22)
    Results([_record(repeats=rep)]).write(tmp_path / "r.json")
    assert load(tmp_path / "r.json").records[0].repeats == rep
    with pytest.raises(ValueError, match="2 rounds for 3 repeats"):
        Repeats(3, 0.1, 0.11, 0.12, (0.1, 0.12))


def test_load_refuses_another_schema(tmp_path):
    p = tmp_path / "old.json"
    p.write_text(json.dumps({"audio": "x.flac", "results": []}))
    with pytest.raises(UserError, match="not a speechrt benchmark result of schema 'speechrt-bench/1'"):
        load(p)


def test_pinned_process_counts_its_cores():
    """Pinned to one core (as taskset does), a benchmark's fingerprint says 1 (the benchmarks' default thread
    counts use the same count) and its caption names both: a pinned run on a big machine must not read as
    the whole machine."""
    import subprocess
    import sys

    code = (
        "import json, os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
        "from speechrt.bench import fingerprint as f; m = f.fingerprint(); "
        "print(json.dumps([m['cpu']['logical_cores'], m['cpu']['machine_logical_cores'], f.describe(m)]))"
    )
    one, total, caption = json.loads(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    )
    assert one == 1 and total == os.cpu_count()
    assert (f"(1 of {total} logical cores" in caption) if total > 1 else "(1 logical cores" in caption


def test_fingerprint_matches_this_machine():
    m = fingerprint.fingerprint()
    cpu = m["cpu"]
    flags = set(
        next(ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags"))
        .split(":")[1]
        .split()
    )
    for feature in ("avx2", "avx512f", "amx_tile", "avx512_bf16"):
        assert cpu["isa"][feature] == (feature in flags), feature
    cap = torch.backends.cpu.get_cpu_capability()
    assert cpu["torch_capability"] == cap
    if cap in ("AVX2", "AVX512"):  # torch's own detection agrees with the kernel's flags
        assert cpu["isa"]["avx2"]
    assert cpu["memory_gib"] > 0 and cpu["machine_logical_cores"] == os.cpu_count()
    assert cpu["logical_cores"] == len(os.sched_getaffinity(0))  # what taskset leaves this process
    entry = dict(
        ln.split(":", 1) for ln in Path("/proc/cpuinfo").read_text().split("\n\n")[0].splitlines() if ":" in ln
    )
    entry = {k.strip(): v.strip() for k, v in entry.items()}
    if "cpu family" in entry:  # x86: the family and model number lscpu prints
        assert cpu["family"] == f"family {entry['cpu family']} model {entry['model']}"
        assert cpu["family"] in fingerprint.label(m) and cpu["family"] in fingerprint.describe(m)
    sw = m["software"]
    assert sw["packages"]["torch"] == importlib.metadata.version("torch")
    assert sw["speechrt"] == speechrt.__version__
    head = subprocess.run(
        ["git", "-C", str(Path(speechrt.__file__).parent.parent), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    assert sw["git_commit"] == (head or None)
    assert m["gpus"] == [] if not torch.cuda.is_available() else m["gpus"][0]["name"] == torch.cuda.get_device_name(0)
    assert "CPUExecutionProvider" in sw["onnxruntime_providers"]
    assert fingerprint.fingerprint("lab box")["label"] == "lab box"
