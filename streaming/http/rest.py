"""OpenAI-compatible REST endpoints on the server's port, served by the same engine under the same key:
POST /v1/audio/transcriptions, /v1/audio/translations (transcriptions.py), /v1/audio/speech (speech.py),
/v1/chat/completions (chat.py), GET /v1/models. Transcription runs long-form one 30-s window per engine step
(engine.stream over ASRPipeline.transcribe_steps), speech one synthesis window per step, chat completions join the
language model's continuous batch: a REST request takes turns with the Realtime sessions instead of holding the
engine. This module admits them: at most `max_rest_requests` run at once (429 past that); uploads over
`max_upload_bytes` get 413."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from speechrt.errors import UserError

from .. import model_names
from ..engine import EngineStalled
from .access import authorized, json_error
from .chat import chat_completion
from .endpoint import RestError
from .speech import Speech
from .transcriptions import Transcriptions

log = logging.getLogger(__name__)


class Guarded(Response):
    """A response that gives the request's admission slot back once it has been sent, or the client has
    gone (streamed bodies hold the slot while they stream)."""

    def __init__(self, inner: Response, release):
        self.inner, self.release = inner, release
        self.status_code, self.background = inner.status_code, None

    async def __call__(self, scope, receive, send):
        try:
            await self.inner(scope, receive, send)
        finally:
            self.release()
            body = getattr(self.inner, "body_iterator", None)
            if hasattr(body, "aclose"):
                await body.aclose()  # a client that left: the engine work behind the stream stops


class RestAPI:
    """The endpoints of one SpeechServer, and their admission; `register(app)` adds their routes."""

    def __init__(self, server):
        self.server = server
        self.o = server.options
        self.active = 0
        self.audio = Transcriptions(server)
        self.speech = Speech(server)

    # -- admission -------------------------------------------------------------------------------------
    async def serve(self, request: Request, endpoint: str, handler) -> Response:
        s, c = self.server, self.server.counters
        c.rest_requests[endpoint] += 1
        if not authorized(request.headers, self.o.api_key):
            c.auth_failures += 1
            return json_error(401, "invalid or missing API key (send 'Authorization: Bearer <key>')", "invalid_api_key")
        if s.shutting_down:
            return json_error(503, "the server is shutting down", "server_shutting_down", "server_error")
        if not s.rest_room(self.active):
            c.rest_rejected += 1
            return json_error(
                429,
                f"the server is busy: {self.o.max_rest_requests} REST requests at most at once "
                "(--max-rest-requests); try again later",
                "rate_limit_exceeded",
                "rate_limit_error",
            )
        self.active += 1
        released = False

        def release():
            nonlocal released
            if not released:
                released = True
                self.active -= 1
                s.rest_changed(self.active)

        try:
            response = await handler(request)
        except RestError as e:
            response = e.response()
        except UserError as e:
            response = json_error(400, str(e), "invalid_value")
        except EngineStalled as e:
            c.stalls += 1
            response = json_error(503, f"the request failed: {e}", "engine_stalled", "server_error")
        except Exception as e:  # noqa: BLE001 - one request's failure is its own; the server goes on
            log.exception("%s failed", endpoint)
            response = json_error(500, f"the request failed: {type(e).__name__}: {e}", "server_error", "server_error")
        if response.status_code >= 400:
            c.rest_errors += 1
        if isinstance(response, StreamingResponse):
            return Guarded(response, release)
        release()
        return response

    async def chat(self, request: Request):
        return await chat_completion(self.server, request)

    # -- models ----------------------------------------------------------------------------------------
    def model_list(self) -> list[dict]:
        """Every name the endpoints accept (model_names.catalog): the loaded models, then 'speechrt' and OpenAI's
        names, each with its family and `root`, the loaded model it stands for (vLLM's field for an alias)."""
        created = int(self.server.counters.started)
        return [
            {"id": n, "object": "model", "created": created, "owned_by": "speechrt", "family": f, "root": root}
            for n, f, root in model_names.catalog(self.server.names)
        ]

    async def models(self, request: Request):
        return JSONResponse({"object": "list", "data": self.model_list()})

    async def model(self, request: Request):
        """One model by name: any name an endpoint accepts (a dated OpenAI snapshot too), as its list entry shows it."""
        name = request.path_params["model"]
        listed = {m["id"]: m for m in self.model_list()}
        base = model_names.canonical(name)
        if base in listed:
            return JSONResponse({**listed[base], "id": name})
        raise RestError(404, f"model {name!r} is not served here; models: {', '.join(listed)}", "model_not_found")

    def register(self, app: FastAPI) -> None:
        for path, method, handler in (
            ("/v1/audio/transcriptions", "POST", self.audio.transcriptions),
            ("/v1/audio/translations", "POST", self.audio.translations),
            ("/v1/audio/speech", "POST", self.speech.speech),
            ("/v1/chat/completions", "POST", self.chat),
            ("/v1/models", "GET", self.models),
            ("/v1/models/{model:path}", "GET", self.model),  # a Hub id has a slash: openai/whisper-large-v3
        ):
            app.add_api_route(path, self.route(path, handler), methods=[method], include_in_schema=False)

    def route(self, endpoint: str, handler):
        async def route(request: Request):
            return await self.serve(request, endpoint, handler)

        return route
