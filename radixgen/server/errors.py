"""Request errors and their JSON shape: every failure is `{"error": {"message", "type", "param", "code"}}`.

One shape (OpenAI's) for the native and the OpenAI routes alike, so a client needs one error reader. The
message names the offending field and says what is wrong with it; `param` repeats the field's path.
"""

from __future__ import annotations

import re

import orjson
from aiohttp import web

from radixgen.runtime.sampling_params import FIELD_NAMES

# The first word of an engine ValueError names the field when it is one of these (engine_api.md's promise).
_ENGINE_FIELDS = FIELD_NAMES | {"sampling_params", "input_ids", "prompt", "top_logprobs_num", "logprob_start_len"}
_LEADING_NAME = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


class ApiError(Exception):
    """A request that cannot be served: HTTP status, a one-line message, and the field it is about."""

    def __init__(self, status: int, message: str, param: str | None = None, type: str = "invalid_request_error",
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> web.Response:
        return json_response(self.body(), status=self.status)


def bad_request(param: str | None, reason: str) -> ApiError:
    """A 400 whose message starts with the field: `temperature: must be in [0, 2], got 7`."""
    message = f"{param}: {reason}" if param else reason
    return ApiError(400, message, param=param)


def from_engine_error(exc: ValueError, prefix: str = "") -> ApiError:
    """The engine's ValueError (its message starts with the field name) as a 400 naming that field."""
    message = str(exc)
    match = _LEADING_NAME.match(message)
    param = match.group(0) if match and match.group(0) in _ENGINE_FIELDS else None
    if param == "sampling_params" and prefix:
        param = prefix
    elif param and prefix and param not in ("prompt", "input_ids"):
        param = f"{prefix}.{param}"
    return ApiError(400, message, param=param)


def internal_error(message: str) -> ApiError:
    return ApiError(500, message, type="internal_error")


def json_response(obj: object, status: int = 200) -> web.Response:
    return web.Response(body=dumps(obj), status=status, content_type="application/json")


def dumps(obj: object) -> bytes:
    """orjson with numpy support; anything else it cannot encode is written as its str()."""
    return orjson.dumps(obj, default=str, option=orjson.OPT_SERIALIZE_NUMPY)
