"""What the REST endpoints share: the error a refused request raises (RestError), the checks of common arguments,
server-sent events, and the steps they run on the engine's worker (engine_stream)."""

from __future__ import annotations

import json

from fastapi import Request
from starlette.responses import JSONResponse

from .. import model_names
from .access import json_error

SSE = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


class RestError(Exception):
    """A request the endpoint refuses: an HTTP status and a message that says what is wrong and what is valid."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str = "invalid_value",
        type_: str = "invalid_request_error",
        param: str | None = None,
    ):
        super().__init__(message)
        self.status, self.code, self.type, self.param = status, code, type_, param

    def response(self) -> JSONResponse:
        return json_error(self.status, str(self), self.code, self.type, self.param)


def sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False) if not isinstance(obj, str) else obj}\n\n"


def check_model(name, family: str, server, what: str) -> None:
    """A request's `model`: a name of the loaded `family` model (model_names: the one naming policy), else a
    RestError listing the valid ones."""
    if not name:
        valid = ", ".join(model_names.accepted(family, server.names))
        raise RestError(400, f"'model' is required; {what} models here: {valid}", "missing_required_parameter")
    if not model_names.accepts(name, family, server.names):
        raise RestError(404, model_names.unknown(name, family, server.names, what), "model_not_found")


def loaded(model, what: str):
    """`model` (a pipeline of the server), or a 404 saying the server loads no such model."""
    if model is None:
        raise RestError(
            404, f"this server loads no {what} (it was started with --transcription-only)", "model_not_found"
        )
    return model


def number(value, name: str, lo: float, hi: float, default):
    if value is None or value == "":
        return default
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise RestError(400, f"{name} must be a number in [{lo:g}, {hi:g}], got {value!r}") from None
    if not lo <= x <= hi:
        raise RestError(400, f"{name} must be in [{lo:g}, {hi:g}], got {value!r}")
    return x


async def json_body(request: Request) -> dict:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        raise RestError(400, "the request body must be a JSON object", "invalid_json") from None
    if not isinstance(body, dict):
        raise RestError(400, "the request body must be a JSON object", "invalid_json")
    return body


async def engine_stream(server, gen, family: str):
    """Items of generator `gen` run on the server's engine worker of `family` (asr, tts) one step each; the engine
    task stops if the consumer does."""
    eng = server.engine
    task, q = eng.stream(gen, family)
    try:
        while True:
            item = await eng.wait(q.get(), server.options.stall_timeout, family)
            if isinstance(item, StopAsyncIteration):
                return
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        task.cancelled = True
