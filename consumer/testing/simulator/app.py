"""The simulator's ASGI app: every route of both providers and the control routes."""

from __future__ import annotations

from dataclasses import fields

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, Router

from consumer.testing.simulator.batches import BatchRoutes
from consumer.testing.simulator.chat import ChatRoutes
from consumer.testing.simulator.config import SimulatorConfig, parse_faults
from consumer.testing.simulator.responses import OrjsonResponse


class SimulatorApp(ChatRoutes, BatchRoutes):
    """The ASGI app (`app`, Starlette's router alone: the application wrapper's error and
    exception middleware would cost every request two more layers, and an unhandled error is a
    500 from uvicorn as from them) and its state. `server` (a uvicorn.Server) is set when served,
    so drops can close the client's connection."""

    def __init__(self, config: SimulatorConfig) -> None:
        super().__init__(config)
        routes = [
            Route("/v1/chat/completions", self.openai_chat, methods=["POST"]),
            Route("/v1/embeddings", self.openai_embeddings, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/files", self.openai_upload, methods=["POST"]),
            Route("/v1/files/{file_id}/content", self.openai_file_content, methods=["GET"]),
            Route("/v1/batches", self.openai_create_batch, methods=["POST"]),
            Route("/v1/batches/{batch_id}", self.openai_get_batch, methods=["GET"]),
            Route("/v1/batches/{batch_id}/cancel", self.openai_cancel_batch, methods=["POST"]),
            Route("/v1/messages", self.anthropic_messages, methods=["POST"]),
            Route("/v1/messages/batches", self.anthropic_create_batch, methods=["POST"]),
            Route("/v1/messages/batches/{batch_id}", self.anthropic_get_batch, methods=["GET"]),
            Route("/v1/messages/batches/{batch_id}/results", self.anthropic_results, methods=["GET"]),
            Route("/v1/messages/batches/{batch_id}/cancel", self.anthropic_cancel_batch, methods=["POST"]),
            Route("/_sim/stats", self.stats, methods=["GET"]),
            Route("/_sim/reset", self.reset_route, methods=["POST"]),
            Route("/_sim/config", self.config_route, methods=["GET", "POST"]),
        ]
        self.app = Router(routes=routes)

    # -------- control routes

    async def stats(self, request: Request) -> Response:
        """GET /_sim/stats."""
        return OrjsonResponse(self.stats_.snapshot())

    async def reset_route(self, request: Request) -> Response:
        """POST /_sim/reset."""
        self.reset()
        return OrjsonResponse({"ok": True})

    async def config_route(self, request: Request) -> Response:
        """GET /_sim/config: the knobs; POST {knob: value, ...} (names as in --faults) changes them."""
        if request.method == "POST":
            try:
                changes = orjson.loads(await request.body() or b"{}")
                if not isinstance(changes, dict):
                    raise ValueError("body must be a JSON object of knob: value")
                text = ",".join(
                    f"{k}={'' if v is None else str(v).lower() if isinstance(v, bool) else v}"
                    for k, v in changes.items()
                )
                self.configure(parse_faults(text, self.config))
            except (orjson.JSONDecodeError, ValueError) as exc:
                return OrjsonResponse({"error": str(exc)}, status_code=400)
        shown = {f.name: getattr(self.config, f.name) for f in fields(SimulatorConfig)}
        shown["api_key"] = "(set)" if self.config.api_key else None
        return OrjsonResponse(shown)
