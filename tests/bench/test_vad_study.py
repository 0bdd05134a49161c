"""`python -m benchmarks.vad_study` runs every mode it compares, on the real Silero graphs, briefly."""

from __future__ import annotations

from benchmarks import vad_study


def test_every_mode_runs_its_streams(capsys):
    vad_study.main(["--streams", "3", "--seconds", "0.5", "--rounds", "1"])
    lines = capsys.readouterr().out.splitlines()
    for mode in vad_study.MODES:
        row = [line for line in lines if line.split()[:1] == ["3"] and f" {mode} " in line]
        assert len(row) == 1, (mode, lines)
        cores, rounds, p50, p95 = row[0].split(mode)[1].split()
        assert 0 < float(cores) < 2.5 and 0 < float(p50) <= float(p95), row
