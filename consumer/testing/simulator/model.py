"""The deterministic model: what the simulator answers to a prompt (see the package docstring)."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from consumer.testing.simulator.config import SimulatorConfig


def answer_for(text: str) -> str:
    """The simulator's answer to one input: "sim:" + sha256(input)[:12] (distinct per input)."""
    return "sim:" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def extract_input(prompt_text: str) -> str:
    """An ordinary prompt's input: the text after the last line ending with ":", stripped;
    the whole text stripped when no line ends with ":"."""
    lines = prompt_text.split("\n")
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].rstrip().endswith(":"):
            return "\n".join(lines[index + 1 :]).strip()
    return prompt_text.strip()


def parse_batch_items(prompt_text: str) -> list[tuple[str, str]] | None:
    """A batched prompt's items [(alias, input)] from its JSON-array line; None when not batched."""
    for line in reversed(prompt_text.split("\n")):
        stripped = line.strip()
        if not (stripped.startswith("[") and stripped.endswith("]")):
            continue
        try:
            value = orjson.loads(stripped)
        except orjson.JSONDecodeError:
            continue
        if (
            isinstance(value, list)
            and value
            and all(isinstance(v, dict) and isinstance(v.get("id"), str) and "input" in v for v in value)
        ):
            return [
                (v["id"], v["input"] if isinstance(v["input"], str) else orjson.dumps(v["input"]).decode())
                for v in value
            ]
    return None


#: the schema of a plain string answer (a packed prompt's items, most often)
_STRING = {"type": "string"}


def _digest_int(text: str) -> int:
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:8], 16)


def value_for_schema(schema: Any, text: str, _depth: int = 0) -> Any:
    """A value obeying `schema`, determined by `text` (see the module docstring)."""
    if not isinstance(schema, Mapping) or _depth > 8 or schema == _STRING:
        return answer_for(text)
    if "const" in schema:
        return schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return enum[_digest_int(text) % len(enum)]
    for key in ("anyOf", "oneOf", "allOf"):
        options = schema.get(key)
        if isinstance(options, list) and options:
            return value_for_schema(options[0], text, _depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        props = schema.get("properties") or {}
        return {name: value_for_schema(sub, text, _depth + 1) for name, sub in props.items()}
    if kind == "array":
        return [value_for_schema(schema.get("items", {}), text, _depth + 1)]
    if kind == "integer":
        return len(text)
    if kind == "number":
        return float(len(text))
    if kind == "boolean":
        return len(text) % 2 == 0
    if kind == "null":
        return None
    return answer_for(text)


def batched_answer(
    items: Sequence[tuple[str, str]], schema: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The correct answer to a batched prompt: {alias: value}; string values are answer_for(input)."""
    props = (schema or {}).get("properties") or {}
    # an alias-free schema (a map whose values follow additionalProperties) fits every alias
    extra = (schema or {}).get("additionalProperties")
    default = extra if isinstance(extra, Mapping) else {"type": "string"}
    return {alias: value_for_schema(props.get(alias, default), text) for alias, text in items}


def estimate_tokens(text: str) -> int:
    """Usage tokens ~ len(text) / 4 (at least 1 for non-empty text)."""
    return math.ceil(len(text) / 4)



@dataclass(slots=True)
class SimAnswer:
    """What the model produced for one request."""

    text: str
    value: Any  # structured value for tool answers (None: answer as text)
    finish: str  # "stop" | "length"
    items: int
    batched: bool
    fault: str | None = None


def compact(value: Any) -> str:
    return orjson.dumps(value).decode()


def _partial(value: dict[str, Any], max_chars: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        out[key] = item
        if len(compact(out)) > max_chars:
            del out[key]
            break
    return out


def model_answer(
    prompt_text: str,
    schema: Mapping[str, Any] | None,
    *,
    tool: bool,
    max_tokens: int | None,
    rng: random.Random | None = None,
    config: SimulatorConfig | None = None,
) -> SimAnswer:
    """Answer one prompt. With `rng` and `config`, batched answers may carry the configured faults."""
    items = parse_batch_items(prompt_text)
    fault: str | None = None
    finish = "stop"
    if items is not None:
        value: Any = batched_answer(items, schema)
        if rng is not None and config is not None:
            roll = rng.random()
            edges = (
                ("malformed", config.malformed_rate),
                ("truncated", config.truncated_rate),
                ("missing", config.missing_rate),
                ("extra", config.extra_rate),
            )
            acc = 0.0
            for name, rate in edges:
                acc += rate
                if roll < acc:
                    fault = name
                    break
        if fault == "missing":
            del value[rng.choice(sorted(value)) if rng else next(iter(value))]
        elif fault == "extra":
            value["x" + format(rng.getrandbits(24) if rng else 0, "06x")] = answer_for("extra")
        text = compact(value)
        if fault == "malformed":
            text = "Sure! Here are the answers:\n" + "\n".join(f"- {a}: {answer_for(t)}" for a, t in items)
            value = None
        elif fault == "truncated":
            text = text[: max(1, len(text) // 2)]
            value = _partial(value, len(text))
            finish = "length"
        n_items = len(items)
    else:
        value = value_for_schema(schema, extract_input(prompt_text)) if schema is not None else None
        text = compact(value) if value is not None else answer_for(extract_input(prompt_text))
        n_items = 1
    if max_tokens is not None and estimate_tokens(text) > max_tokens:
        text = text[: max_tokens * 4]
        if isinstance(value, dict):
            value = _partial(value, len(text))
        finish = "length"
    if not tool or not text:
        value = None  # max_tokens 0 (Anthropic: only fill the prompt cache) generates nothing
    return SimAnswer(text, value, finish, n_items, items is not None, fault)
