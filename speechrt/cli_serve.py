"""`speechrt serve`: the Realtime WebSocket server on the embedded (or given) models."""

from __future__ import annotations


def add_arguments(p):
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument(
        "--asr", default=None, help="speech recognition model: name, path or Hub id (default: whisper-tiny.en)"
    )
    p.add_argument("--lm", default=None, help="language model: name, path or Hub id (default: smollm2-135m-instruct)")
    p.add_argument(
        "--tts", default=None, help="voice: name, path or Hub id owner/name:file.onnx (default: piper-en_US-joe-medium)"
    )
    p.add_argument("--transcription-only", action="store_true", help="load no language model or voice")
    p.add_argument(
        "--backend",
        default="auto",
        help="backend of every family without its own flag: auto (default: per "
        "family the backend and precision measured fastest on this kind of machine, see backends/auto.py; "
        "torch where none was measured), torch, triton (CUDA/ROCm GPU), onnxruntime, tensorrt (lm, NVIDIA GPU)",
    )
    p.add_argument(
        "--asr-backend",
        default=None,
        help="speech recognition backend (default: --backend; onnxruntime "
        "exports the model on first use into the export cache)",
    )
    p.add_argument(
        "--lm-backend",
        default=None,
        help="language model backend (default: --backend; onnxruntime "
        "exports the model on first use into the export cache)",
    )
    p.add_argument(
        "--tts-backend",
        default=None,
        help="speech synthesis backend (default: --backend; onnxruntime runs the voice graph as shipped)",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (ROCm GPUs are cuda too) or auto (default cpu)")
    p.add_argument(
        "--asr-dtype",
        default="auto",
        help="speech recognition dtype (default auto: bfloat16 on CPUs with "
        "native bf16, float32 on others, float16 on GPUs)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' for sessions (also "
        "$SPEECHRT_API_KEY); /healthz and /metrics stay open for probes and scrapers unless --private-metrics",
    )
    p.add_argument(
        "--private-metrics",
        action="store_true",
        help="with --api-key: /metrics and the full /healthz "
        "need the key too (without it /healthz answers only its status)",
    )
    p.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        help="browser origin allowed besides pages served from loopback or the bound address (repeatable; '*' for any)",
    )
    p.add_argument(
        "--max-sessions",
        type=int,
        default=32,
        help="sessions served at once; one more is told (session_limit_reached) and closed with 1013 (default 32)",
    )
    p.add_argument(
        "--max-rest-requests",
        type=int,
        default=16,
        help="OpenAI REST requests (/v1/audio/*, "
        "/v1/chat/completions) served at once; one more is answered 429 (default 16)",
    )
    p.add_argument(
        "--max-upload-bytes",
        type=int,
        default=25 << 20,
        help="largest audio file POST /v1/audio/transcriptions accepts; a larger one is answered 413 (default 25 MiB)",
    )
    p.add_argument(
        "--max-message-bytes",
        type=int,
        default=1 << 20,
        help="largest client event; a larger one gets an error event and the session goes on (default 1 MiB)",
    )
    p.add_argument(
        "--max-buffer-seconds",
        type=float,
        default=120.0,
        help="uncommitted input audio a session may "
        "hold (default 120 s); with turn detection only the open turn is held",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=300.0,
        help="seconds without an event either way before a session is closed (default 300)",
    )
    p.add_argument(
        "--stall-timeout",
        type=float,
        default=60.0,
        help="seconds the engine may spend in one model step "
        "(a hang) before the sessions waiting on it are told their transcript or answer failed; waiting "
        "behind other work that moves is not a stall (default 60)",
    )
    p.add_argument(
        "--drain-seconds",
        type=float,
        default=15.0,
        help="on SIGTERM/SIGINT: time given to final "
        "transcripts and answers in flight before the sessions are closed (default 15)",
    )
    p.add_argument(
        "--max-send-queue-bytes",
        type=int,
        default=8 << 20,
        help="events a session may have waiting for "
        "a client that does not read them; then the session is closed (1008) (default 8 MiB)",
    )
    p.add_argument(
        "--ping-interval",
        type=float,
        default=20.0,
        help="seconds between WebSocket pings; a client that "
        "does not answer one within --ping-timeout is closed (default 20)",
    )
    p.add_argument("--ping-timeout", type=float, default=20.0, help="see --ping-interval (default 20)")
    p.add_argument(
        "--silence-duration-ms",
        type=int,
        default=None,
        help="milliseconds of silence that end a turn under server_vad when a session does not set it "
        "(default: the API's 500)",
    )
    p.add_argument(
        "--asr-loop-threads",
        type=int,
        default=1,
        help="CPU threads for the small ops of transcript decoding (default 1: robust when the cores are "
        "shared; 0: all threads, faster on an otherwise idle machine)",
    )
    p.add_argument(
        "--lm-threads",
        type=int,
        default=0,
        help="CPU threads for language model steps (default 0: all, for the fastest answers; 1 leaves a core "
        "to transcription and voice activity detection)",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=None,
        help="transcripts of one kind (final or live), and "
        "language-model replies, run together in one model step at most (default 8 on a CPU, 32 on a GPU)",
    )
    p.add_argument(
        "--partial-interval",
        type=float,
        default=1.0,
        help="seconds between live transcript updates while a person speaks (default %(default)s; 0: final "
        "transcripts only)",
    )
    p.add_argument(
        "--final-margin",
        type=float,
        default=None,
        metavar="SECONDS",
        help="seconds of padding after a turn's audio that its final transcript encodes (default 10; 30: "
        "whole windows): less is faster and may lose words",
    )
    p.add_argument(
        "--loaded-final-margin",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the final margin while the engine is loaded (its worker busy 90%% of the last 2 s, 30%% on "
        "other work than live transcripts): default 3 on a CPU, or --final-margin if less; 0: the "
        "full margin always, the default on a GPU",
    )
    p.add_argument(
        "--no-speculative-replies",
        dest="speculative_replies",
        action="store_false",
        help="do not begin a reply during a pause before it ends the turn (by default a reply begun in a "
        "pause is sent at once if the pause ends the turn, and dropped if speech resumes)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for PyTorch (default: all cores, shared out among --workers)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="engine processes behind the one port, each with its own models and engine, a session on one for "
        "its life, --max-sessions across them all (default 1 on a CPU, 2 on a GPU; docs/scale-out.md)",
    )
    p.add_argument(
        "--debug-endpoints",
        action="store_true",
        help="serve POST /debug/fault (inject a failing or stalling model step; for tests, never in production)",
    )
    r = p.add_argument_group("Ray Serve (--ray; docs/scale-out.md; needs pip install 'speechrt[ray]')")
    r.add_argument(
        "--ray",
        action="store_true",
        help="serve on Ray Serve: replicas each with their own models and "
        "engine behind one endpoint at --host:--port, a WebSocket pinned to its replica",
    )
    r.add_argument(
        "--ray-address",
        default=None,
        help="Ray cluster to join (default: $RAY_ADDRESS, else start one on this machine)",
    )
    r.add_argument("--replicas", type=int, default=1, help="fixed number of replicas (default 1)")
    r.add_argument("--min-replicas", type=int, default=None, help="autoscaling: fewest replicas (with --max-replicas)")
    r.add_argument("--max-replicas", type=int, default=None, help="autoscaling: most replicas (with --min-replicas)")
    r.add_argument(
        "--target-sessions",
        type=float,
        default=None,
        help="autoscaling: ongoing sessions per replica to aim for (default 3/4 of --max-sessions)",
    )
    r.add_argument(
        "--replica-cpus",
        type=float,
        default=1.0,
        help="CPUs each replica reserves (default 1; also its PyTorch threads unless --threads)",
    )
    r.add_argument(
        "--replica-gpus",
        type=float,
        default=0.0,
        help="GPUs each replica reserves (default 0; 1 with --device cuda; fractions share a GPU)",
    )
    r.add_argument(
        "--graceful-shutdown-s",
        type=float,
        default=30.0,
        help="time a stopping replica has to finish "
        "turns in flight and tell its sessions before Serve kills it (default 30; > --drain-seconds)",
    )


def server_config(args):
    """The server's whole configuration (streaming/config.py) from the command line, checked before any model
    loads."""
    from speechrt.streaming.config import ServerConfig

    unset = {"max_batch": args.max_batch, "loaded_final_margin": args.loaded_final_margin}
    return ServerConfig(
        models=model_config(args),
        options=options(args),
        device_defaults=frozenset(name for name, value in unset.items() if value is None),
    )


def model_config(args):
    """Which models the server loads and how they run (streaming.config.ModelConfig), from the command line."""
    from speechrt.streaming.config import ModelConfig

    return ModelConfig(
        asr=args.asr,
        lm=args.lm,
        tts=args.tts,
        transcription_only=args.transcription_only,
        backend=args.backend,
        asr_backend=args.asr_backend,
        lm_backend=args.lm_backend,
        tts_backend=args.tts_backend,
        device=args.device,
        asr_dtype=args.asr_dtype,
        asr_loop_threads=args.asr_loop_threads,
        lm_threads=args.lm_threads,
        threads=args.threads,
    )


def options(args):
    """ServerOptions from the command line (checked before any model loads)."""
    import os

    from speechrt.streaming.config import ServerOptions

    final_margin = ServerOptions.final_margin if args.final_margin is None else args.final_margin
    return ServerOptions(
        host=args.host,
        port=args.port,
        api_key=args.api_key or os.environ.get("SPEECHRT_API_KEY"),
        origins=tuple(args.allow_origin),
        private_metrics=args.private_metrics,
        max_sessions=args.max_sessions,
        max_batch=max_batch(args),
        max_rest_requests=args.max_rest_requests,
        max_upload_bytes=args.max_upload_bytes,
        max_message_bytes=args.max_message_bytes,
        max_buffer_seconds=args.max_buffer_seconds,
        idle_timeout=args.idle_timeout,
        stall_timeout=args.stall_timeout,
        drain_seconds=args.drain_seconds,
        max_send_queue_bytes=args.max_send_queue_bytes,
        ping_interval=args.ping_interval,
        ping_timeout=args.ping_timeout,
        silence_duration_ms=args.silence_duration_ms,
        partial_interval=args.partial_interval,
        final_margin=final_margin,
        loaded_final_margin=loaded_margin(args, final_margin),
        speculative_replies=args.speculative_replies,
        debug=args.debug_endpoints,
    )


def on_gpu(args) -> bool:
    from speechrt.backends.auto import machine_kind

    return machine_kind(args.device) in ("nvidia", "rocm")


def max_batch(args) -> int:
    """--max-batch, or its default on this machine's device (streaming.config.device_default)."""
    from speechrt.streaming.config import device_default

    return device_default("max_batch", on_gpu(args)) if args.max_batch is None else args.max_batch


def loaded_margin(args, final_margin: float) -> float | None:
    """--loaded-final-margin: None for 0 (never less than the final margin), or its default on this machine's
    device (streaming.config.device_default)."""
    from speechrt.streaming.config import device_default

    if args.loaded_final_margin is None:
        return device_default("loaded_final_margin", on_gpu(args), final_margin)
    return args.loaded_final_margin or None


def workers(args) -> int:
    """--workers, or its default on this machine's device (streaming.config.device_default)."""
    from speechrt.errors import UserError
    from speechrt.streaming.config import device_default

    n = device_default("workers", on_gpu(args)) if args.workers is None else args.workers
    if n < 1:
        raise UserError(f"--workers must be >= 1, got {n}")
    if args.ray and args.workers not in (None, 1):
        raise UserError("--workers is for one machine; on Ray Serve each replica is one process: use --replicas")
    return n


def load_models(args):
    """Load the models the command line names once; they are shared by every session (ModelConfig.load)."""
    return model_config(args).load()


def scale_options(args):
    """How `speechrt serve --ray` scales (streaming.scale.ScaleOptions; importing it imports ray)."""
    from speechrt.streaming.scale import ScaleOptions

    return ScaleOptions(
        replicas=args.replicas,
        min_replicas=args.min_replicas,
        max_replicas=args.max_replicas,
        target_sessions=args.target_sessions,
        num_cpus=args.replica_cpus,
        num_gpus=args.replica_gpus,
        graceful_shutdown_s=args.graceful_shutdown_s,
    )


def run(args):
    n = workers(args)
    if args.ray:
        from speechrt.streaming import scale  # imports ray; an error names `pip install 'speechrt[ray]'`

        config = server_config(args)  # the server's options are checked before Ray starts
        return scale.run(config, scale_options(args), args.ray_address)
    import asyncio
    import importlib
    import time
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from speechrt.streaming.listen import listen_socket

    config = server_config(args)
    if n > 1:
        from speechrt.streaming.workers import front

        return front.run(config, n)
    opts = config.options
    listen_socket(opts.host, opts.port).close()  # a port in use is said now, not after the models load
    if config.models.threads:
        torch.set_num_threads(config.models.threads)
    t = time.perf_counter()
    with ThreadPoolExecutor(1, "import") as pool:  # the HTTP stack imported while the models load
        server = pool.submit(importlib.import_module, "speechrt.streaming.server")
        asr, lm, tts = config.models.load()
        server = server.result()
    print(f"speechrt: models loaded in {time.perf_counter() - t:.1f} s", flush=True)
    for p in (asr, lm, tts):
        if p is not None:
            print(f"  {p.info}", flush=True)
    asyncio.run(server.serve_forever(server.SpeechServer(opts, asr, lm, tts)))
    return 0
