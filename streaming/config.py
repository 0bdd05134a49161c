"""The configuration of the whole server, frozen and checked up front: which models and how they run (ModelConfig),
the address, limits and options (ServerOptions), both together (ServerConfig). `speechrt serve` builds it from its
arguments; SpeechServer (server.py) takes its options and its models, and so do the Ray Serve replicas (scale.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from speechrt.errors import UserError

from .asr_options import FINAL_MARGIN_S, LOADED_FINAL_MARGIN_S
from .realtime.policy import TurnPolicy


@dataclass(frozen=True)
class ModelConfig:
    """The models every session shares, and how they run. `asr`, `lm`, `tts`: registered names or paths (None: the
    embedded defaults); `transcription_only`: no language model or voice. `backend` for every family without its
    own (`asr_backend`, ...). `asr_loop_threads`, `lm_threads`: CPU threads of the small ops of transcript decoding
    and of language model steps (0: all); `threads`: PyTorch's (None: all cores, or a replica's CPUs)."""

    asr: str | None = None
    lm: str | None = None
    tts: str | None = None
    transcription_only: bool = False
    backend: str = "auto"
    asr_backend: str | None = None
    lm_backend: str | None = None
    tts_backend: str | None = None
    device: str = "cpu"
    asr_dtype: str = "auto"
    asr_loop_threads: int = 1
    lm_threads: int = 0
    threads: int | None = None

    def load(self) -> tuple:
        """Load the models once -> (asr, lm, tts) pipelines; lm and tts are None with transcription_only. The
        engine's worker thread shares the cores with the event loop and VAD: by default the small ops of decoding
        run on one thread. The models load side by side, each in its own thread (ONNX Runtime's sessions, the
        exports made on first use and numpy / torch work release the GIL): the first error is raised."""
        from concurrent.futures import ThreadPoolExecutor

        import torch

        from speechrt.pipelines.asr import load_asr
        from speechrt.pipelines.lm import load_lm
        from speechrt.pipelines.tts import load_tts

        jobs = {"asr": lambda: load_asr(self.asr, *self.asked("asr"), self.asr_loop_threads or None)}
        if not self.transcription_only:
            jobs["lm"] = lambda: load_lm(self.lm, *self.asked("lm"), self.lm_threads or None)
            jobs["tts"] = lambda: load_tts(self.tts, *self.asked("tts"))
        # a runner takes its thread count from the thread that builds it (OpenMP's count is per thread)
        threads = torch.get_num_threads()
        with ThreadPoolExecutor(len(jobs), "load", initializer=torch.set_num_threads, initargs=(threads,)) as pool:
            running = {family: pool.submit(job) for family, job in jobs.items()}
            try:
                got = {family: f.result() for family, f in running.items()}
            except BaseException:
                for f in running.values():
                    f.cancel()
                raise
        return got["asr"], got.get("lm"), got.get("tts")

    def asked(self, family: str) -> tuple[str, str, str | None]:
        """(backend, device, dtype) a family's model is loaded with, as given ('auto' unresolved)."""
        backend = getattr(self, f"{family}_backend") or self.backend
        return backend, self.device, self.asr_dtype if family == "asr" else None

    def runs(self, family: str) -> tuple[str, str | None]:
        """The backend and precision a family's model runs on here (backends.auto.resolve: 'auto' is the table's
        choice for this machine); a None precision is the backend's own default."""
        from speechrt.backends.auto import resolve

        backend, device, dtype = self.asked(family)
        return resolve(family, backend, device, dtype)


@dataclass(frozen=True)
class ServerOptions:
    """The server's address, limits and options: what a SpeechServer takes beside its loaded models."""

    host: str = "127.0.0.1"
    port: int = 8765
    api_key: str | None = None
    origins: tuple[str, ...] = ()  # browser origins allowed besides loopback pages ("*" allows any)
    private_metrics: bool = False  # with api_key: /metrics and the full /healthz need the key too
    max_sessions: int = 32
    max_message_bytes: int = 1 << 20  # larger events get an error event; the session goes on
    max_frame_bytes: int = 64 << 20  # larger WebSocket frames close the connection (1009)
    max_send_queue_bytes: int = 8 << 20  # events waiting for a client that does not read; then it is closed
    socket_send_buffer: int = 256 << 10  # kernel send buffer per connection (the kernel doubles it)
    max_buffer_seconds: float = 120.0  # uncommitted input audio per session
    max_item_chars: int = 32_768  # text of one conversation item
    max_conversation_chars: int = 1 << 20  # text of all the items of a conversation
    idle_timeout: float = 300.0  # seconds without an event either way before the session is closed
    stall_timeout: float = 60.0  # seconds the engine may spend in one step before the sessions waiting are told
    drain_seconds: float = 15.0  # graceful shutdown: time given to transcripts and answers in flight
    ping_interval: float = 20.0  # WebSocket pings; a client that does not answer within ping_timeout is closed
    ping_timeout: float = 20.0
    partial_interval: float = 1.0  # seconds between live transcript updates of a turn; 0: none
    # seconds of padding after a turn's audio that its final transcript's encoder reads (asr_options.FINAL_MARGIN_S;
    # 30: whole windows). Less is faster and may lose words (benchmarks/margin_study.py)
    final_margin: float = FINAL_MARGIN_S
    # the final margin while the engine is loaded (busy 90 % of the last 2 s, 30 % on other work than live
    # transcripts: engine.load.LoadedMargins); None: never less than final_margin (nor is a larger one). 3 s keeps
    # the capacity of 3-s finals on slow CPUs (docs/onnx-runtime.md)
    loaded_final_margin: float | None = LOADED_FINAL_MARGIN_S
    speculative_replies: bool = True  # begin a reply during a pause, before it ends the turn (realtime/reply.py)
    silence_duration_ms: int | None = None  # server default for server_vad (None: the API's 500 ms)
    max_batch: int = 8
    max_rest_requests: int = 16  # REST requests served at once; one more is answered 429
    max_upload_bytes: int = 25 << 20  # largest audio file /v1/audio/transcriptions accepts (413 past it)
    debug: bool = False  # /debug endpoints: fault injection into the engine (tests)

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise UserError(f"port must be in [0, 65535] (0 picks a free one), got {self.port}")
        if self.max_send_queue_bytes < 1024:
            raise UserError(f"max_send_queue_bytes must be >= 1024, got {self.max_send_queue_bytes}")
        if self.max_sessions < 1:
            raise UserError(f"max_sessions must be >= 1, got {self.max_sessions}")
        if self.max_batch < 1:
            raise UserError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.max_rest_requests < 1:
            raise UserError(f"max_rest_requests must be >= 1, got {self.max_rest_requests}")
        if self.max_upload_bytes < 1024:
            raise UserError(f"max_upload_bytes must be >= 1024, got {self.max_upload_bytes}")
        if not 1024 <= self.max_message_bytes <= self.max_frame_bytes:
            raise UserError(
                f"max_message_bytes must be at least 1024 and at most max_frame_bytes "
                f"({self.max_frame_bytes}), got {self.max_message_bytes}"
            )
        TurnPolicy.from_options(self)  # checks the turn-taking options (final_margin, partial_interval, ...)
        for name in (
            "idle_timeout",
            "stall_timeout",
            "drain_seconds",
            "ping_interval",
            "ping_timeout",
            "max_buffer_seconds",
        ):
            if not getattr(self, name) > 0:
                raise UserError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.api_key is not None and not self.api_key:
            raise UserError("api_key must not be empty (omit it to disable authentication)")


def device_default(name: str, gpu: bool, final_margin: float = FINAL_MARGIN_S):
    """An option's default on the device the models run on. max_batch: 8 rows on a CPU (a batch's cost grows with
    its rows there), 32 on a GPU, where a step of 32 rows costs about what one of 8 does (docs/gpu.md).
    loaded_final_margin: the server's (at most `final_margin`) on a CPU; none on a GPU, whose encoder has time for
    the full margin (a 3-s margin cost a loaded H200 8 % WER on short questions: docs/gpu.md).
    workers (`speechrt serve --workers`): 1 on a CPU, whose cores one engine already keeps busy (two workers on two
    cores doubled the final transcripts' p95 at 24 streams: docs/scale-out.md); 2 on a GPU, where one process left
    the chip 3-7 % busy and two processes on one H200 met every target to 96 streams against 48 for one
    (docs/gpu.md)."""
    if name == "max_batch":
        return 32 if gpu else 8
    if name == "loaded_final_margin":
        return None if gpu else min(LOADED_FINAL_MARGIN_S, final_margin)
    if name == "workers":
        return 2 if gpu else 1
    raise ValueError(f"{name!r} has no device default; those that have: max_batch, loaded_final_margin, workers")


@dataclass(frozen=True)
class ServerConfig:
    """The whole server: its models and its options. `device_defaults`: the options left to the device's default
    (device_default), set again where the models load (on_device): a Ray replica's device may not be the one
    that built the configuration."""

    models: ModelConfig = field(default_factory=ModelConfig)
    options: ServerOptions = field(default_factory=ServerOptions)
    device_defaults: frozenset[str] = frozenset()

    def on_device(self, gpu: bool) -> ServerOptions:
        """The options, those in device_defaults set for a GPU (`gpu`) or a CPU."""
        o = self.options
        return dataclasses.replace(o, **{n: device_default(n, gpu, o.final_margin) for n in self.device_defaults})
