"""The simulator's JSON responses, written by orjson: the simulator shares the machine with
the service it serves, so what it spends per response is taken from the service's CPU."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse

__all__ = ["OrjsonResponse"]


class OrjsonResponse(JSONResponse):
    """starlette's JSONResponse (compact JSON, UTF-8), rendered by orjson."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
