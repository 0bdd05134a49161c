"""End to end: the browser demo page (streaming/http/static/index.html) in headless Chromium, with Chromium's fake
microphone playing speechrt/data/sample.wav, talks to the real server (real Whisper, real Silero VAD) over
the Realtime API, and the final transcript it shows must match the recording's text.

Chromium is driven through the DevTools protocol over a WebSocket (the `websockets` package the server
already depends on): no WebDriver, no version pairing with a chromedriver.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

import speechrt
from speechrt.models.audio import resample
from speechrt.models.wer import wer

DATA = Path(speechrt.__file__).parent / "data"
API_KEY = "demo-page-test-key"
LEAD_S, TAIL_S = 0.5, 3.0  # silence around the speech in the fake microphone's file
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

# what the test reads from the page: its state, status line and the user's turns
SNAPSHOT_JS = """(() => !document.getElementById('transcript') ? {state: 'loading', finals: [], pending: []} : ({
  state: document.body.dataset.state,
  status: document.getElementById('status').textContent,
  finals: [...document.querySelectorAll('#transcript .turn.user.final .text')].map(e => e.textContent.trim()),
  pending: [...document.querySelectorAll('#transcript .turn.user:not(.final) .text')].map(e => e.textContent.trim()),
}))()"""


def find_chromium() -> str | None:
    if os.environ.get("SPEECHRT_CHROMIUM"):
        return os.environ["SPEECHRT_CHROMIUM"]
    return next(filter(None, map(shutil.which, CHROMIUM_NAMES)), None)


CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="needs a Chromium browser: `apt-get install -y chromium` (or set SPEECHRT_CHROMIUM)"
)


class Browser:
    """Headless Chromium with a fake microphone, one page, driven over the DevTools protocol."""

    def __init__(self, wav: Path, workdir: Path):
        from websockets.sync.client import connect

        profile = workdir / "profile"
        self.log_path = workdir / "chromium.log"
        args = [
            CHROMIUM,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={wav}%noloop",
            "--autoplay-policy=no-user-gesture-required",
            # offline machine: no update checks, sync, first-run pages or other background traffic
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-default-apps",
            "--disable-extensions",
            "--disable-features=Translate,MediaRouter,OptimizationHints",
            "--window-size=1000,800",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "about:blank",
        ]
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        self.console: list[str] = []
        self._ids = itertools.count(1)
        try:
            port_file = profile / "DevToolsActivePort"
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().strip()):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"Chromium did not start (exit code {self.proc.poll()}):\n{self.log_tail()}")
                time.sleep(0.05)
            port = int(port_file.read_text().split()[0])
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                page = next(t for t in json.load(r) if t["type"] == "page")
            self.ws = connect(page["webSocketDebuggerUrl"], max_size=64 << 20, open_timeout=10)
            self.call("Runtime.enable")
            self.call("Page.enable")
        except BaseException:
            self.close()
            raise

    def log_tail(self, n: int = 3000) -> str:
        self.log.flush()
        return self.log_path.read_bytes()[-n:].decode(errors="replace")

    def call(self, method: str, timeout: float = 20, **params):
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.01, deadline - time.monotonic())))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]
            if msg.get("method") == "Runtime.consoleAPICalled":
                p = msg["params"]
                self.console.append(
                    f"console.{p['type']}: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"])
                )
            elif msg.get("method") == "Runtime.exceptionThrown":
                d = msg["params"]["exceptionDetails"]
                self.console.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")

    def navigate(self, url: str):
        self.call("Page.navigate", url=url)

    def eval(self, expression: str):
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"page script failed: {r['exceptionDetails']}")
        return r["result"].get("value")

    def screenshot(self, path: str):
        Path(path).write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))

    def close(self):
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        # Chromium runs in its own session (start_new_session): signal the whole group, so no renderer
        # or utility process outlives the test
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(10)
                break
            except subprocess.TimeoutExpired:
                continue
        self.log.close()


@pytest.fixture(scope="module")
def server(asr, server_factory):
    from speechrt.streaming.config import ServerOptions

    with server_factory(ServerOptions(port=0, api_key=API_KEY), asr) as srv:
        yield srv


@pytest.fixture(scope="module")
def mic_wav(tmp_path_factory):
    """sample.wav as Chromium's fake microphone plays it: 16-bit PCM at 48 kHz, silence around the speech.
    Returns (path, seconds from the file's start to the end of the speech)."""
    x, sr = sf.read(DATA / "sample.wav", dtype="float32")
    x = resample(x, sr, 48000)
    y = np.concatenate([np.zeros(int(LEAD_S * 48000), np.float32), x, np.zeros(int(TAIL_S * 48000), np.float32)])
    path = tmp_path_factory.mktemp("mic") / "speech.wav"
    sf.write(path, y, 48000, subtype="PCM_16")
    return path, LEAD_S + len(x) / 48000


@pytest.fixture
def browser(mic_wav):
    with tempfile.TemporaryDirectory(prefix="speechrt-chromium-") as d:
        b = Browser(mic_wav[0], Path(d))
        yield b
        b.close()


def _diagnostics(browser: Browser, snap: dict | None) -> str:
    try:
        events = browser.eval("[...document.querySelectorAll('#log > div')].map(e => e.textContent).join('\\n')")
    except Exception as e:  # the page itself may be gone
        events = f"(unavailable: {e})"
    return (
        f"\npage: {snap}\npage event log:\n{events}\nconsole:\n"
        + "\n".join(browser.console[-30:])
        + f"\nchromium output (tail):\n{browser.log_tail()}"
    )


# 24000: the page's normal path (Chromium converts the microphone to the context's 24 kHz);
# 48000: the context runs at 48 kHz and the page's AudioWorklet resamples to 24 kHz itself (Firefox's path)
@pytest.mark.parametrize("context_rate", [24000, 48000])
def test_demo_page_transcribes_the_microphone(server, browser, mic_wav, context_rate):
    _, speech_end = mic_wav
    reference = (DATA / "sample.txt").read_text().strip()
    t_start = time.monotonic()
    browser.navigate(
        f"http://127.0.0.1:{server.port}/?autostart=1&mode=transcription&key={API_KEY}&rate={context_rate}"
    )
    live_at = None
    saw_partial = False
    snap = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        snap = browser.eval(SNAPSHOT_JS)
        if snap["state"] == "error":
            pytest.fail(f"the page reports an error: {snap['status']}" + _diagnostics(browser, snap))
        if snap["state"] == "live" and live_at is None:
            live_at = time.monotonic()
        saw_partial |= any(snap["pending"])
        # done: the whole recording has been heard, and every turn it started has its final transcript
        if (
            live_at is not None
            and time.monotonic() - live_at > speech_end + 1.0
            and snap["finals"]
            and not snap["pending"]
        ):
            break
        time.sleep(0.2)
    else:
        pytest.fail("no complete final transcript within 60 s" + _diagnostics(browser, snap))
    if os.environ.get("SPEECHRT_DEMO_SCREENSHOT"):
        browser.screenshot(os.environ["SPEECHRT_DEMO_SCREENSHOT"])
    rate = browser.eval("document.getElementById('log').textContent.match(/context at (\\d+) Hz/)[1]")
    assert int(rate) == context_rate, f"the page ran its audio context at {rate} Hz"
    hypothesis = " ".join(snap["finals"])
    error = wer(reference, hypothesis)
    print(
        f"\ndemo page: {len(snap['finals'])} turn(s) in {time.monotonic() - t_start:.1f} s, live partials seen: "
        f"{saw_partial}, WER {error:.3f}\n  {hypothesis}"
    )
    # Whisper tiny.en on the file itself: WER 0.12 ("speech run time", "popper voice")
    assert error <= 0.2, f"WER {error:.3f} for {hypothesis!r} (reference {reference!r})" + _diagnostics(browser, snap)
    exceptions = [c for c in browser.console if c.startswith("exception")]
    assert not exceptions, f"uncaught errors in the page: {exceptions}"


def _wait_for_error(browser, failure: str, timeout: float = 20) -> dict:
    """The page's state once it shows an error (polled), or the test fails with `failure`."""
    deadline = time.monotonic() + timeout
    snap = None
    while time.monotonic() < deadline:
        snap = browser.eval(SNAPSHOT_JS)
        if snap["state"] == "error":
            return snap
        time.sleep(0.1)
    pytest.fail(failure + _diagnostics(browser, snap))


def test_demo_page_shows_why_the_server_refused(server, browser):
    """A wrong API key: the handshake is refused, and the page says so instead of failing silently."""
    browser.navigate(f"http://127.0.0.1:{server.port}/?autostart=1&mode=transcription&key=wrong-key")
    snap = _wait_for_error(browser, "the page showed no error for a refused connection")
    assert "refused" in snap["status"] and "API key" in snap["status"], snap["status"]
    assert server.counters.auth_failures >= 1


def test_demo_page_shows_the_servers_error_message(server, browser):
    """Conversation mode on a server started with only the speech recognizer: the server's error event
    (the reply to the page's session.update) is shown in the status line and the session stops."""
    browser.navigate(f"http://127.0.0.1:{server.port}/?autostart=1&mode=conversation&key={API_KEY}")
    snap = _wait_for_error(browser, "the page showed no error for conversation mode without conversation models")
    assert "Server error: this server runs transcription only" in snap["status"], snap["status"]
