#!/usr/bin/env bash
# The Ray path's overhead against plain `speechrt serve` (docs/scale-out.md): both servers up on this machine
# (transcription only, the same defaults), `speechrt bench server` measuring them level by level in the same
# run (1 stream: plain then Ray; 8 streams: plain then Ray), the whole sweep REPEATS times.
# Usage: docs/ray/measure-overhead.sh [REPEATS] (from the project root; PYTHON=.venv/bin/python)
set -euo pipefail
PY=${PYTHON:-python}
REPEATS=${1:-2}
OUT=${OUT:-/tmp/speechrt-ray-overhead}
mkdir -p "$OUT"
$PY -m speechrt serve --transcription-only --port 8765 --max-sessions 64 > "$OUT/plain.log" 2>&1 &
PLAIN=$!
$PY -m speechrt serve --ray --transcription-only --port 8766 --replicas 1 --replica-cpus "$(nproc)" \
    --max-sessions 64 > "$OUT/ray.log" 2>&1 &
RAY=$!
trap 'kill -INT $PLAIN $RAY 2>/dev/null; wait $PLAIN $RAY 2>/dev/null || true' EXIT
for port in 8765 8766; do
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/healthz" > /dev/null && break; sleep 1; done
done
lscpu | grep 'Model name'
PLAIN_URL=ws://127.0.0.1:8765/v1/realtime
RAY_URL=ws://127.0.0.1:8766/v1/realtime
for i in $(seq "$REPEATS"); do
  $PY -m speechrt bench server --url $PLAIN_URL --also-url ray=$RAY_URL --streams 1,8 --keep-going --peer none \
      --utterances 4 --json "$OUT/run$i.json"
done
# one stream, more utterances: the p50 of 1 stream from more samples
$PY -m speechrt bench server --url $PLAIN_URL --also-url ray=$RAY_URL --streams 1 --peer none --utterances 16 \
    --json "$OUT/one-stream.json"
# the hop itself: one small event's round trip, plain and Ray in turn
$PY "$(dirname "$0")/ws_rtt.py" $PLAIN_URL $RAY_URL 500
