"""radixgen.server: the HTTP server (aiohttp) over one in-process engine.

Layout: app.py builds the application (routes, middlewares, warm-up); native.py is SGLang's native API;
openai_protocol.py / openai_api.py the OpenAI-compatible API; programs.py / programs_api.py registered
programs; generation.py runs one request's engine streams (merging, aborting, measuring); metrics.py the
Prometheus registry; fields.py / errors.py request checking and the error shape; sse.py server-sent events;
launch.py the `radixgen serve` command and a background-thread server.
"""

from radixgen.server.app import create_app
from radixgen.server.state import ServerSettings

__all__ = ["ServerSettings", "create_app"]
