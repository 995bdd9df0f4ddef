"""Offline batch execution: a Batch API job runs when it is first looked at after
`batch_delay_s`, each request checked and answered as the online API would."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from consumer.testing.simulator.embeddings import EMBEDDINGS_URL, embeddings_body, embeddings_refusal
from consumer.testing.simulator.model import estimate_tokens, model_answer
from consumer.testing.simulator.refusals import Refusal, request_refusal
from consumer.testing.simulator.wire import (
    anthropic_message_body,
    max_tokens_of,
    openai_completion_body,
    request_view,
)

if TYPE_CHECKING:
    from consumer.testing.simulator.state import BatchJob, SimulatorState


def _item_errored(
    sim: SimulatorState, batch: BatchJob, cid: str, refusal: Refusal, errors: list[bytes]
) -> None:
    """Record one batch request as refused, the way each provider reports it: OpenAI, a line
    of the error file carrying the 400 response; Anthropic, an `errored` result."""
    batch.counts["errored"] += 1
    if batch.kind == "openai":
        error = {
            "message": refusal.message,
            "type": "invalid_request_error",
            "param": refusal.param,
            "code": refusal.code,
        }
        record_id = sim.new_id("batch_req_")  # ids before the request id: seeded runs keep their ids
        response = {"status_code": 400, "request_id": sim.new_id("req_"), "body": {"error": error}}
        errors.append(
            orjson.dumps({"id": record_id, "custom_id": cid, "response": response, "error": None})
        )
        return
    error_body = {"type": "error", "error": {"type": "invalid_request_error", "message": refusal.message}}
    batch.results.append({"custom_id": cid, "result": {"type": "errored", "error": error_body}})


def _openai_line(sim: SimulatorState, cid: str, make_body: Callable[[], dict[str, Any]]) -> bytes:
    """One line of an OpenAI batch's output file: the 200 response of request `cid` (its ids
    drawn in the output's order: record, request, then the body's own)."""
    record_id = sim.new_id("batch_req_")
    response = {"status_code": 200, "request_id": sim.new_id("req_"), "body": make_body()}
    return orjson.dumps({"id": record_id, "custom_id": cid, "response": response, "error": None})


def line_tokens(line: dict[str, object]) -> int:
    """The input tokens of one OpenAI batch line, as the online API would count them."""
    body = line.get("body")
    if not isinstance(body, dict):
        return 0
    if line.get("url") == EMBEDDINGS_URL:
        inputs = body.get("input")
        texts = inputs if isinstance(inputs, list) else [inputs]
        return sum(estimate_tokens(str(t)) for t in texts)
    return estimate_tokens(request_view(body, "openai", ignore_structured=False)[3])


@dataclass
class _BatchRun:
    """What running one batch writes: OpenAI's output and error file lines (Anthropic's
    results go to the batch itself)."""

    sim: SimulatorState
    batch: BatchJob
    outputs: list[bytes] = field(default_factory=list)
    errors: list[bytes] = field(default_factory=list)

    def item(self, line: dict[str, Any]) -> None:
        """One request: checked as the online API checks it, before it can run or expire;
        then expired, errored or answered as the seeded roll says."""
        cfg, batch = self.sim.config, self.batch
        cid, kind = line["custom_id"], batch.kind
        body = line.get("body") if kind == "openai" else line.get("params")
        self.sim.stats_.counters["batch_items"] += 1
        embedding = kind == "openai" and line.get("url") == EMBEDDINGS_URL
        refusal = embeddings_refusal(body) if embedding else request_refusal(body, kind, in_batch=True)
        if refusal is not None:
            _item_errored(self.sim, batch, cid, refusal, self.errors)
            return
        roll = self.sim.rng.random()
        if roll < cfg.batch_expire_rate:
            self.expired(cid)
        elif roll < cfg.batch_expire_rate + cfg.batch_error_rate:
            refused = Refusal("simulated item error: the request was rejected")
            _item_errored(self.sim, batch, cid, refused, self.errors)
        else:
            assert isinstance(body, dict)  # request_refusal refuses anything else
            batch.counts["succeeded"] += 1
            if embedding:
                answered = embeddings_body(body)
                self.sim.stats_.counters["items_answered"] += len(answered["data"])
                self.outputs.append(_openai_line(self.sim, cid, lambda: answered))
            else:
                self.answered(cid, body)

    def expired(self, cid: str) -> None:
        self.batch.counts["expired"] += 1
        if self.batch.kind != "openai":
            self.batch.results.append({"custom_id": cid, "result": {"type": "expired"}})
            return
        error = {
            "code": "batch_expired",
            "message": "This request could not be executed before the completion window expired.",
        }
        record = {"id": self.sim.new_id("batch_req_"), "custom_id": cid, "response": None, "error": error}
        self.errors.append(orjson.dumps(record))

    def answered(self, cid: str, body: dict[str, Any]) -> None:
        """A chat request answered by the model, in the batch's wire format."""
        sim, kind = self.sim, self.batch.kind
        ignore = sim.config.ignore_structured
        prompt, schema, tool, all_text = request_view(body, kind, ignore_structured=ignore)
        answer = model_answer(prompt, schema, tool=tool, max_tokens=max_tokens_of(body))
        sim.stats_.counters["items_answered"] += answer.items
        tin, tout = estimate_tokens(all_text), estimate_tokens(answer.text)
        model = str(body.get("model") or "sim")
        read, written = sim.cache_usage(kind, body, all_text)
        if kind == "openai":
            def completion() -> dict[str, Any]:
                return openai_completion_body(answer, model, tin, tout, sim.new_id("chatcmpl-"), read)

            self.outputs.append(_openai_line(sim, cid, completion))
            return
        message = anthropic_message_body(answer, model, tin, tout, sim.new_id("msg_"), read, written)
        self.batch.results.append({"custom_id": cid, "result": {"type": "succeeded", "message": message}})

    def end(self) -> None:
        """The batch ended: OpenAI's output and error files written, the status set."""
        sim, batch = self.sim, self.batch
        batch.ended_s = time.monotonic()
        if batch.kind != "openai":
            batch.status = "ended"
            return
        if self.outputs:
            batch.output_file_id = sim.new_id("file-")
            sim.files[batch.output_file_id] = ("output.jsonl", b"\n".join(self.outputs) + b"\n")
        if self.errors:
            batch.error_file_id = sim.new_id("file-")
            sim.files[batch.error_file_id] = ("errors.jsonl", b"\n".join(self.errors) + b"\n")
        batch.status = "expired" if batch.counts["expired"] else "completed"


def run_if_due(sim: SimulatorState, batch: BatchJob) -> None:
    """Run `batch` if it has not ended and `batch_delay_s` has passed since it was created."""
    if batch.ended_s is not None or time.monotonic() - batch.created_s < sim.config.batch_delay_s:
        return
    run = _BatchRun(sim, batch)
    for line in batch.lines:
        run.item(line)
    run.end()
