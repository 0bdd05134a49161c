"""Who may use the server over HTTP: the API key (a Bearer header, or the Realtime API's subprotocol form) and the
browser origins allowed, and the OpenAI-shaped JSON error that a refused request gets."""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from starlette.responses import JSONResponse

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def json_error(
    status: int, message: str, code: str, type_: str = "invalid_request_error", param: str | None = None
) -> JSONResponse:
    """OpenAI's error body; `param` (the request field at fault) where one is named."""
    err = {"message": message, "type": type_, "code": code}
    if param is not None:
        err["param"] = param
    return JSONResponse(
        {"error": err},
        status_code=status,
        headers={"Cache-Control": "no-store"},
    )


def key_matches(header_value: str, key: str) -> bool:
    """Compare a key from a header (decoded as latin-1, as HTTP headers are) with the configured key, as
    bytes: any key, ASCII or not, compares in constant time instead of raising."""
    return hmac.compare_digest(header_value.encode("latin-1", "replace"), key.encode("utf-8"))


def authorized(headers, key: str | None) -> bool:
    if key is None:
        return True
    auth = headers.get("authorization", "")
    if auth.startswith("Bearer ") and key_matches(auth[7:].strip(), key):
        return True
    # browsers cannot set headers on a WebSocket: the API's subprotocol form carries the key
    for proto in headers.get("sec-websocket-protocol", "").split(","):
        proto = proto.strip()
        if proto.startswith("openai-insecure-api-key.") and key_matches(proto.split(".", 1)[1], key):
            return True
    return False


def origin_ok(origin: str | None, allowed: tuple[str, ...], bound_host: str) -> bool:
    """Browsers send Origin; other clients do not. A page may connect if its origin is configured, or
    is served from this machine's loopback or the address the server is bound to. The Host header is
    not trusted (DNS rebinding makes it the attacker's)."""
    if origin is None or "*" in allowed or origin in allowed:
        return True
    host = urlsplit(origin).hostname
    return host in LOOPBACK or (bound_host not in ("", "0.0.0.0", "::") and host == bound_host)
