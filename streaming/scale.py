"""speechrt on Ray Serve: many replicas, each with its own models and Engine, behind one Realtime endpoint.

Each replica is a SpeechServer started without a listening socket; Serve's proxy serves its ASGI app (the
app of streaming/http/app.py build_app, whole: /v1/realtime, REST, /healthz, /metrics, the demo page) through
`@serve.ingress`, so the protocol has one code path. A WebSocket stays on the replica that accepted it for
its whole life. New sessions go to the replica with the most spare capacity (CapacityRouter: sessions and
engine queue depth that each replica reports as routing stats, and the requests the router has in flight
to it); a full replica answers as one server does (`session_limit_reached`, close 1013).

Stopping a replica (scale-down, redeploy, `serve shutdown`): Serve marks it STOPPING and waits for its
ongoing requests, which for a WebSocket means until it closes. The replica sees its state (StopWatch) and
runs SpeechServer.shutdown(graceful=True): no new sessions, final transcripts and answers in flight finish
(drain_seconds), then every session gets an `error` event (server_shutting_down) saying to reconnect,
and is closed with 1001; a new connection lands on another replica. graceful_shutdown_timeout_s bounds it.

/metrics/cluster: the replicas push their figures every second to one MetricsBoard deployment; any
replica renders them, per replica and summed.

The deployment is built from a ServerConfig (streaming/config.py) and ScaleOptions, which `speechrt serve --ray`
builds from its arguments, and `speechrt.scale:app` from a Serve config's `args`. Only they import this module (and
ray)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import random
import time
from dataclasses import dataclass

from fastapi import Request
from starlette.responses import Response

from speechrt.backends.auto import machine_kind
from speechrt.errors import UserError

from .config import ServerConfig
from .http.access import authorized, json_error
from .http.app import build_app
from .http.metrics import cluster_metrics_text
from .server import SpeechServer

try:
    import ray
    from ray import serve
    from ray.serve.config import RequestRouterConfig
    from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica
except ImportError as e:  # pragma: no cover - depends on the environment
    raise UserError(f"speechrt on Ray Serve needs ray[serve] 2.46 or newer ({e}): pip install 'speechrt[ray]'") from e

log = logging.getLogger(__name__)

HTTP_HEADROOM = 8  # requests a replica takes beyond its session cap: /healthz, /metrics, REST while full
STALE_S = 10.0  # a replica that has not reported for this long is left out of /metrics/cluster
STOP_NOTICE = (
    "this replica is stopping (scale-down or redeploy): turns committed before were finished, audio sent "
    "after the drain began was not taken; "
    "reconnect to continue on another replica"
)


@dataclass(frozen=True)
class ScaleOptions:
    """How the deployment scales: a fixed number of replicas, or autoscaling between min and max on
    ongoing sessions (target_sessions per replica); what each replica reserves (num_cpus, num_gpus)."""

    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    target_sessions: float | None = None  # default: 3/4 of max_sessions
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    graceful_shutdown_s: float = 30.0  # Serve's graceful_shutdown_timeout_s; more than drain_seconds
    stats_period_s: float = 1.0  # how often replicas report sessions and queue depth to the routers

    def __post_init__(self):
        if self.replicas < 1:
            raise UserError(f"--replicas must be >= 1, got {self.replicas}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise UserError(
                "autoscaling needs both --min-replicas and --max-replicas (or neither, for a fixed --replicas)"
            )
        if (
            self.autoscaling
            and not 0 <= self.min_replicas <= self.max_replicas
            or (self.max_replicas is not None and self.max_replicas < 1)
        ):
            raise UserError(
                f"need 0 <= --min-replicas <= --max-replicas and --max-replicas >= 1, got "
                f"{self.min_replicas} and {self.max_replicas}"
            )
        if self.target_sessions is not None and not self.target_sessions > 0:
            raise UserError(f"--target-sessions must be > 0, got {self.target_sessions}")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise UserError(f"--replica-cpus and --replica-gpus must be >= 0, got {self.num_cpus}, {self.num_gpus}")
        if not self.graceful_shutdown_s > 0 or not self.stats_period_s > 0:
            raise UserError(
                f"--graceful-shutdown-s and stats period must be > 0, got {self.graceful_shutdown_s}, "
                f"{self.stats_period_s}"
            )

    @property
    def autoscaling(self) -> bool:
        return self.max_replicas is not None

    def deployment_options(self, max_sessions: int, drain_seconds: float) -> dict:
        """Options of serve.deployment for replicas that admit max_sessions sessions each."""
        if self.graceful_shutdown_s <= drain_seconds:
            raise UserError(
                f"--graceful-shutdown-s ({self.graceful_shutdown_s:g}) must exceed --drain-seconds "
                f"({drain_seconds:g}): Serve kills a replica at the end of it"
            )
        d = dict(
            ray_actor_options={"num_cpus": self.num_cpus, "num_gpus": self.num_gpus},
            max_ongoing_requests=max_sessions + HTTP_HEADROOM,
            graceful_shutdown_timeout_s=self.graceful_shutdown_s,
            graceful_shutdown_wait_loop_s=1.0,
            request_router_config=RequestRouterConfig(
                request_router_class=f"{__name__}:CapacityRouter",
                request_routing_stats_period_s=self.stats_period_s,
                request_routing_stats_timeout_s=5.0,
            ),
        )
        if self.autoscaling:
            d["autoscaling_config"] = {
                "min_replicas": self.min_replicas,
                "max_replicas": self.max_replicas,
                "initial_replicas": max(self.min_replicas, 1),
                "target_ongoing_requests": self.target_sessions or max(1.0, 0.75 * max_sessions),
                "upscale_delay_s": 10.0,
                "downscale_delay_s": 120.0,
            }
        else:
            d["num_replicas"] = self.replicas
        return d


class CapacityRouter(FIFOMixin, RequestRouter):
    """New requests go to the replica with the most spare capacity: the lowest sessions over its session
    cap, plus its engine backlog; replicas stopping come last, ties are broken at random. A replica's
    sessions: the requests this router has in flight to it (Serve's queue-length cache, counted up as it
    sends; where it has no fresh entry, what the replica last reported in its routing stats), plus the
    requests this router has chosen it for and not sent yet (several are routed at once). One replica per
    rank: a full one (at max_ongoing_requests) is passed over for the next."""

    CHOICE_S = 5.0  # a choice not followed by a send within this long is forgotten

    def initialize_state(self, **kwargs):
        self.choosing: dict[object, tuple[float, object]] = {}  # request -> (when, replica id), not sent yet

    def on_send_request(self, replica_id):
        super().on_send_request(replica_id)  # the cache counts it from now on
        key = next((k for k, (_, rid) in self.choosing.items() if rid == replica_id), None)
        self.choosing.pop(key, None)

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        cache, now = self.replica_queue_len_cache, time.monotonic()
        self.choosing = {k: v for k, v in getattr(self, "choosing", {}).items() if now - v[0] < self.CHOICE_S}
        chosen = collections.Counter(rid for _, rid in self.choosing.values())

        def load(r: RunningReplica):
            s = r.routing_stats or {}
            cap = s.get("max_sessions") or r.max_ongoing_requests
            ongoing = cache.get(r.replica_id)
            sessions = (ongoing if ongoing is not None else s.get("sessions", 0)) + chosen[r.replica_id]
            return bool(s.get("draining")), sessions / cap + s.get("queue_depth", 0) / (4 * cap), random.random()

        ranked = sorted(candidate_replicas, key=load)
        if ranked:  # one entry per request: a request routed again replaces its earlier choice
            key = pending_request.metadata.internal_request_id if pending_request is not None else object()
            self.choosing[key] = (now, ranked[0].replica_id)
        return [[r] for r in ranked]


class MetricsBoard:
    """The replicas' latest figures (one row each), for /metrics/cluster."""

    def __init__(self):
        self.rows: dict[str, tuple[float, dict]] = {}

    def push(self, replica: str, row: dict) -> None:
        self.rows[replica] = (time.monotonic(), row)

    def drop(self, replica: str) -> None:
        self.rows.pop(replica, None)

    def current(self) -> dict[str, dict]:
        now = time.monotonic()
        return {k: row for k, (t, row) in self.rows.items() if now - t < STALE_S}


def replica_row(server) -> dict:
    """One replica's figures for the board."""
    m, c = server.engine.metrics, server.counters
    final = sorted(m.final_latency)

    def q(p):
        return final[min(len(final) - 1, int(p * len(final)))] if final else float("nan")

    return {
        "sessions": len(server.sessions),
        "max_sessions": server.options.max_sessions,
        "queue_depth": server.engine.queue_depth(),
        "sessions_total": c.sessions_total,
        "sessions_rejected": c.sessions_rejected,
        "utterances": m.asr_items,
        "final_p50": q(0.5),
        "final_p95": q(0.95),
        "draining": server.shutting_down,
        "node": ray.get_runtime_context().get_node_id(),
        "cpu_seconds": round(time.process_time(), 3),
        "engine_seconds": round(m.engine_seconds, 3),
        "finals_loaded_margin": m.finals_loaded_margin,
        "vad_seconds": round(server.vad.seconds, 3),
    }


class StopWatch:
    """Tells a replica that Serve is stopping it: Serve has no hook before it waits for ongoing requests
    (which WebSockets never finish by themselves), so the replica reads its own state from the controller
    (the dashboard's schema, ServeInstanceDetails) every `period` seconds."""

    def __init__(self, app: str, deployment: str, replica: str, period: float = 1.0):
        from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

        self.app, self.deployment, self.replica, self.period = app, deployment, replica, period
        self.controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)

    async def state(self) -> str | None:
        details = await self.controller.get_serve_instance_details.remote()
        dep = details.get("applications", {}).get(self.app, {}).get("deployments", {}).get(self.deployment, {})
        return next((r["state"] for r in dep.get("replicas", []) if r["replica_id"] == self.replica), None)

    async def wait(self) -> None:
        """Return once this replica is STOPPING."""
        while True:
            await asyncio.sleep(self.period)
            try:
                if await self.state() == "STOPPING":
                    return
            except Exception as e:  # noqa: BLE001 - a controller restarting: ask again
                log.warning("replica %s: could not read its state from the Serve controller: %s", self.replica, e)


class SpeechReplica:
    """One replica: its own models, Engine and sessions (a SpeechServer without a socket)."""

    async def __init__(self, config: ServerConfig, board=None):
        import torch

        torch.set_num_threads(
            config.models.threads or max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))
        )
        asr, lm, tts = await asyncio.to_thread(config.models.load)
        # the defaults left to the device, for this replica's (its driver's machine may have no GPU)
        self.server = SpeechServer(
            config.on_device(machine_kind(config.models.device) in ("nvidia", "rocm")), asr, lm, tts
        )
        ctx = serve.get_replica_context()
        self.server.replica = ctx.replica_id.unique_id
        await self.server.start(listen=False)
        self.board = board
        self.watch = StopWatch(ctx.app_name, ctx.deployment, self.server.replica)
        self.tasks = [asyncio.create_task(self.report()), asyncio.create_task(self.stop_when_told())]

    def __serve_build_asgi_app__(self):
        app = build_app(self.server)
        o = self.server.options

        async def cluster_metrics(request: Request):
            if o.private_metrics and not authorized(request.headers, o.api_key):
                return json_error(
                    401,
                    "/metrics/cluster needs the API key ('Authorization: Bearer <key>'): the "
                    "server was started with --private-metrics",
                    "invalid_api_key",
                )
            rows = await asyncio.wait_for(self.board.current.remote(), 5) if self.board is not None else {}
            rows.setdefault(self.server.replica, replica_row(self.server))
            return Response(
                cluster_metrics_text(rows),
                media_type="text/plain; version=0.0.4",
                headers={"Cache-Control": "no-store"},
            )

        app.add_api_route("/metrics/cluster", cluster_metrics, methods=["GET"])
        return app

    def record_routing_stats(self) -> dict:
        return {
            "sessions": len(self.server.sessions),
            "max_sessions": self.server.options.max_sessions,
            "queue_depth": self.server.engine.queue_depth(),
            "draining": self.server.shutting_down,
        }

    async def report(self):
        while self.board is not None:
            with contextlib.suppress(Exception):  # the board restarting: the next report fills it in again
                await asyncio.wait_for(self.board.push.remote(self.server.replica, replica_row(self.server)), 5)
            await asyncio.sleep(1.0)

    async def stop_when_told(self):
        await self.watch.wait()
        log.warning("replica %s is stopping: draining %d sessions", self.server.replica, len(self.server.sessions))
        await self.server.shutdown(graceful=True, notice=STOP_NOTICE)

    async def __del__(self):
        for t in self.tasks:
            t.cancel()
        await self.server.shutdown(graceful=True, notice=STOP_NOTICE)
        if self.board is not None:  # (the board may be stopping too, as when the application is deleted)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.board.drop.remote(self.server.replica), 2)


# built once: a deployment whose definition and arguments are unchanged keeps its replicas when only its
# options change (a new number of replicas scales, it does not redeploy)
SPEECH_DEPLOYMENT = serve.deployment(serve.ingress()(SpeechReplica))
BOARD_DEPLOYMENT = serve.deployment(
    MetricsBoard,
    num_replicas=1,
    ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=1000,
    logging_config={"enable_access_log": False},
)


def application(config: ServerConfig, scale: ScaleOptions, name: str = "speechrt"):
    """The Serve application: SpeechReplica (the ingress, each replica serving `config`) and the MetricsBoard it
    reports to."""
    o = config.options
    replica = SPEECH_DEPLOYMENT.options(name=name, **scale.deployment_options(o.max_sessions, o.drain_seconds))
    return replica.bind(config, BOARD_DEPLOYMENT.options(name=f"{name}-metrics").bind())


def run(config: ServerConfig, scale: ScaleOptions, ray_address: str | None = None) -> int:
    """`speechrt serve --ray`: deploy on the Ray cluster at `ray_address` (default: $RAY_ADDRESS, else start one on
    this machine), serve on the configured host:port through Serve's proxy until SIGINT/SIGTERM, then delete the
    application (each replica drains as on a scale-down)."""
    import signal
    import threading

    host, port = config.options.host, config.options.port
    ray.init(address=ray_address, ignore_reinit_error=True, logging_level=logging.WARNING)
    serve.start(http_options={"host": host, "port": port})
    t = time.perf_counter()
    serve.run(application(config, scale), name="speechrt", route_prefix="/")
    print(
        f"speechrt: {scale.replicas if not scale.autoscaling else f'{scale.min_replicas}-{scale.max_replicas}'} "
        f"replica(s) ready on Ray Serve in {time.perf_counter() - t:.1f} s; serving on http://{host}:"
        f"{port} (Realtime API at ws://{host}:{port}/v1/realtime, cluster metrics at "
        "/metrics/cluster)",
        flush=True,
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    print("speechrt: deleting the application; replicas finish turns in flight", flush=True)
    serve.delete("speechrt")
    serve.shutdown()
    return 0
