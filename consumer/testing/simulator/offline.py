"""Offline batch execution: a Batch API job runs when it is first looked at after
`batch_delay_s`, each request checked and answered as the online API would."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

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


def _openai_line(sim: SimulatorState, cid: str, body: dict[str, object]) -> bytes:
    """One line of an OpenAI batch's output file: the 200 response `body` of request `cid`."""
    record_id = sim.new_id("batch_req_")
    response = {"status_code": 200, "request_id": sim.new_id("req_"), "body": body}
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


def run_if_due(sim: SimulatorState, batch: BatchJob) -> None:
    """Run `batch` if it has not ended and `batch_delay_s` has passed since it was created."""
    cfg = sim.config
    if batch.ended_s is not None or time.monotonic() - batch.created_s < cfg.batch_delay_s:
        return
    outputs: list[bytes] = []
    errors: list[bytes] = []
    for line in batch.lines:
        cid = line["custom_id"]
        kind = batch.kind
        body = line.get("body") if kind == "openai" else line.get("params")
        sim.stats_.counters["batch_items"] += 1
        embedding = kind == "openai" and line.get("url") == EMBEDDINGS_URL
        # each request is checked as the online API checks it, before it can run or expire
        refusal = embeddings_refusal(body) if embedding else request_refusal(body, kind, in_batch=True)
        if refusal is not None:
            _item_errored(sim, batch, cid, refusal, errors)
            continue
        roll = sim.rng.random()
        if roll < cfg.batch_expire_rate:
            batch.counts["expired"] += 1
            if batch.kind == "openai":
                errors.append(
                    orjson.dumps(
                        {
                            "id": sim.new_id("batch_req_"),
                            "custom_id": cid,
                            "response": None,
                            "error": {
                                "code": "batch_expired",
                                "message": "This request could not be executed "
                                "before the completion window expired.",
                            },
                        }
                    )
                )
            else:
                batch.results.append({"custom_id": cid, "result": {"type": "expired"}})
            continue
        if roll < cfg.batch_expire_rate + cfg.batch_error_rate:
            _item_errored(sim,
                batch, cid, Refusal("simulated item error: the request was rejected"), errors
            )
            continue
        assert isinstance(body, dict)  # request_refusal refuses anything else
        batch.counts["succeeded"] += 1
        if embedding:
            answered = embeddings_body(body)
            sim.stats_.counters["items_answered"] += len(answered["data"])
            outputs.append(_openai_line(sim, cid, answered))
            continue
        prompt, schema, tool, all_text = request_view(
            body, kind, ignore_structured=cfg.ignore_structured
        )
        answer = model_answer(prompt, schema, tool=tool, max_tokens=max_tokens_of(body))
        sim.stats_.counters["items_answered"] += answer.items
        tin = estimate_tokens(all_text)
        tout = estimate_tokens(answer.text)
        model = str(body.get("model") or "sim")
        read, written = sim.cache_usage(kind, body, all_text)
        if kind == "openai":
            outputs.append(
                orjson.dumps(
                    {
                        "id": sim.new_id("batch_req_"),
                        "custom_id": cid,
                        "response": {
                            "status_code": 200,
                            "request_id": sim.new_id("req_"),
                            "body": openai_completion_body(
                                answer, model, tin, tout, sim.new_id("chatcmpl-"), read
                            ),
                        },
                        "error": None,
                    }
                )
            )
        else:
            batch.results.append(
                {
                    "custom_id": cid,
                    "result": {
                        "type": "succeeded",
                        "message": anthropic_message_body(
                            answer, model, tin, tout, sim.new_id("msg_"), read, written
                        ),
                    },
                }
            )
    batch.ended_s = time.monotonic()
    if batch.kind == "openai":
        if outputs:
            batch.output_file_id = sim.new_id("file-")
            sim.files[batch.output_file_id] = ("output.jsonl", b"\n".join(outputs) + b"\n")
        if errors:
            batch.error_file_id = sim.new_id("file-")
            sim.files[batch.error_file_id] = ("errors.jsonl", b"\n".join(errors) + b"\n")
        batch.status = "expired" if batch.counts["expired"] else "completed"
    else:
        batch.status = "ended"
