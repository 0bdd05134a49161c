"""Round trip of one small Realtime event (session.update -> session.updated) over an open session, on
plain `speechrt serve` and through Ray Serve's proxy, interleaved (one of each in turn) so that both see the
same background load. What a final transcript pays for the Ray path is one such hop (the last audio chunk
in, the transcript out), so the difference of the medians is the proxy's added latency per turn.

    python docs/ray/ws_rtt.py ws://127.0.0.1:8765/v1/realtime ws://127.0.0.1:8766/v1/realtime [N]
"""

from __future__ import annotations

import asyncio
import json
import sys
import time


async def opened(url: str):
    from websockets.asyncio.client import connect

    ws = await connect(url + "?intent=transcription", max_size=None)
    await ws.recv()  # session.created
    return ws


async def rtt(ws) -> float:
    t = time.perf_counter()
    await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription"}}))
    while json.loads(await ws.recv())["type"] != "session.updated":
        pass
    return time.perf_counter() - t


def pct(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def main(plain: str, ray: str, n: int):
    a, b = await opened(plain), await opened(ray)
    for _ in range(20):  # warm both paths
        await rtt(a), await rtt(b)
    ra, rb = [], []
    for _ in range(n):
        ra.append(await rtt(a))
        rb.append(await rtt(b))
        await asyncio.sleep(0.01)
    for name, xs in (("plain", ra), ("ray", rb)):
        print(f"{name:6} round trip p50 {1000 * pct(xs, 0.5):6.2f} ms  p95 {1000 * pct(xs, 0.95):6.2f} ms  (n={n})")
    print(
        f"ray - plain: p50 {1000 * (pct(rb, 0.5) - pct(ra, 0.5)):+.2f} ms, p95 "
        f"{1000 * (pct(rb, 0.95) - pct(ra, 0.95)):+.2f} ms"
    )
    await a.close()
    await b.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 500))
