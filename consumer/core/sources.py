"""Sources: a decoded record of a topic a company already has, as a job and as its enriched value.

Pure: the caller decodes the record (JSON, or a registry format through its schema) and hands
its value here; this module says what job it is (`SourceMapping.job_of`), which change of the
row it carries (`change_of`, for a Debezium envelope), what the prompt read of it
(`SourceMapping.read_fields`, to know an unchanged update), and the value to write back
(`enriched_value`).

Placeholders are `${dotted.path}` over the decoded value (`${review.text}`, `${items.0.sku}`:
a digit part indexes a list). Each path becomes one template variable with an identifier for a
name, so the job is an ordinary prompt job: a prompt with one placeholder at its very end can be
batched (DESIGN rule 1), and every later step treats it as any other job.

A record that cannot be a job (a field a placeholder names is missing, a Debezium record
without `after`) is a `JobError`: the caller dead-letters the record with its key, bytes and
headers.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from consumer.core.errors import ErrorKind, JobError
from consumer.core.jobs import Job, Message, job_from_fields
from consumer.core.templates import placeholders, render
from consumer.core.tenants import tenant_problem

__all__ = [
    "Change",
    "SourceMapping",
    "change_of",
    "enriched_value",
    "get_path",
    "mapping_problem",
    "source_placeholders",
]

#: `${a.b.c}` (group 1: the escaping `$` of `$${...}`; group 2: the path)
_PATH_PLACEHOLDER = re.compile(r"\$(\$)?\{([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)\}")
#: a compiled prompt's placeholders (identifiers) and the one that ends it
_VARIABLE = re.compile(r"\$(\$)?\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TRAILING = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)\}\Z")
#: Debezium operations that carry a row to enrich (create, snapshot read, update)
_ROW_OPS = frozenset({"c", "r", "u"})


def source_placeholders(text: str) -> list[str]:
    """The dotted paths of `text`'s placeholders, in order (escapes excluded, repeats kept)."""
    return [m.group(2) for m in _PATH_PLACEHOLDER.finditer(text) if m.group(1) is None]


def get_path(value: Any, path: str) -> Any:
    """The value at `path` (dots between keys; a digit part indexes a list), or raise KeyError
    naming the first part that is missing."""
    return _get_parts(value, tuple(path.split(".")))


def _get_parts(value: Any, parts: tuple[str, ...]) -> Any:
    current = value
    for part in parts:
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            raise KeyError(part)
    return current


def _text(value: Any) -> str:
    """A field's value as prompt text: a string as it is, anything else as its JSON."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value, default=str).decode()


@dataclass(frozen=True, slots=True)
class Change:
    """What one record says of its row: `row` to enrich, or None to forget the key (a tombstone:
    a null value, a Debezium delete). `op`: Debezium's (c, r, u, d), or None without an envelope."""

    row: Mapping[str, Any] | None
    op: str | None = None


def change_of(value: Any, envelope: Literal["none", "debezium"]) -> Change:
    """The row a decoded record value carries (None value: a tombstone). A Debezium event's row
    is its `after` (op c, r or u; the JSON converter's `{schema, payload}` wrapping is unwrapped);
    op d is a delete; anything else is a JobError."""
    if value is None:
        return Change(None)
    if envelope == "none":
        if not isinstance(value, Mapping):
            raise JobError(ErrorKind.INVALID_JOB, f"the record is not an object (got {type(value).__name__})")
        return Change(value)
    if isinstance(value, Mapping) and "payload" in value and "op" not in value:
        value = value["payload"]
        if value is None:
            return Change(None)
    if not isinstance(value, Mapping) or "op" not in value:
        raise JobError(ErrorKind.INVALID_JOB, "not a Debezium change event: no 'op'")
    op = value["op"]
    if op == "d":
        return Change(None, "d")
    if op not in _ROW_OPS:
        raise JobError(ErrorKind.INVALID_JOB, f"Debezium op {op!r} carries no row to enrich (c, r, u, d)")
    after = value.get("after")
    if not isinstance(after, Mapping):
        raise JobError(ErrorKind.INVALID_JOB, f"Debezium op {op!r} without 'after'")
    return Change(after, op)


def _variable_names(paths: list[str]) -> dict[str, str]:
    """One template variable name per distinct path: its dots as `__` (`review.text` ->
    `review__text`), made unique."""
    names: dict[str, str] = {}
    taken: set[str] = set()
    for path in paths:
        if path in names:
            continue
        name = base = path.replace(".", "__")
        n = 1
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        names[path] = name
        taken.add(name)
    return names


def _to_template(text: str, names: Mapping[str, str]) -> str:
    """`text` with each `${dotted.path}` as `${variable}` (escapes kept)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return m.group(0)
        return "${" + names[m.group(2)] + "}"

    return _PATH_PLACEHOLDER.sub(sub, text)


#: distinct prompts a mapping keeps made (records of one product, say, share theirs)
PROMPTS_KEPT = 4096
#: a `$` that starts a placeholder (`${name}`), in a value written into a prompt
_STARTS_PLACEHOLDER = re.compile(r"\$(?=\{[A-Za-z_][A-Za-z0-9_]*\})")


def _as_text(value: str) -> str:
    """A value as template text that renders as itself: each `${name}` in it escaped (`$${name}`;
    a `${` that names nothing is text already)."""
    return _STARTS_PLACEHOLDER.sub("$$", value) if "${" in value else value


def _pieces(template: str | None) -> tuple[tuple[tuple[str, str | None], ...], str] | None:
    """A compiled prompt that ends with a placeholder used once: the pieces before it (literal
    text, then the variable after it or None) and its variable; None for any other prompt."""
    if template is None:
        return None
    last = _TRAILING.search(template)
    if last is None or template.count("${" + last.group(1) + "}") > 1:
        return None
    prefix, pieces, at = template[: last.start()], [], 0
    for m in _VARIABLE.finditer(prefix):
        if m.group(1) is not None:  # `$${x}` renders as `${x}`: keep it escaped, as text
            continue
        pieces.append((prefix[at : m.start()], m.group(2)))
        at = m.end()
    pieces.append((prefix[at:], None))
    return tuple(pieces), last.group(1)


def mapping_problem(fields: Mapping[str, Any]) -> str | None:
    """What a source's job fields cannot be (None: nothing): a chat source gives exactly one of
    prompt or messages, an embed source its input; each has a placeholder; `id` and the
    tenant's field are paths."""
    kind, prompt, messages, text = fields["kind"], fields["prompt"], fields["messages"], fields["input"]
    if kind == "embed":
        if text is None or prompt is not None or messages is not None:
            return "an embed source gives input (and neither prompt nor messages)"
        texts = [text]
    else:
        if (prompt is None) == (messages is None) or text is not None:
            return "a chat source gives exactly one of prompt or messages (input is for kind embed)"
        texts = [prompt] if prompt is not None else [content for _role, content in messages]
    if not any(source_placeholders(t) for t in texts):
        return "the job reads nothing of the record: give a ${dotted.path} placeholder"
    return None


@dataclass(frozen=True, slots=True)
class SourceMapping:
    """One source's records as jobs of `tier`: the job fields of `sources.NAME` (see
    `consumer.settings.sources.SourceConfig`), compiled once."""

    name: str
    tier: str
    envelope: Literal["none", "debezium"]
    prompt: str | None
    messages: tuple[tuple[str, str], ...] | None
    kind: Literal["chat", "embed"]
    input: str | None
    batch: bool
    options: Mapping[str, Any]
    tenant: str | None
    tenant_path: str | None
    deadline_s: float | None
    mode: Literal["online", "offline", "auto"] | None
    id_from: str
    answer_field: str
    #: every path a placeholder reads, in order of first use, and its variable name
    names: Mapping[str, str] = field(init=False)
    _prompt: str | None = field(init=False)
    _messages: tuple[tuple[str, str], ...] | None = field(init=False)
    _input: str | None = field(init=False)
    #: each path split at its dots, once
    _split: tuple[tuple[str, tuple[str, ...]], ...] = field(init=False)
    #: a prompt that ends with a placeholder: the literal text and the variable (None: none)
    #: of each piece before it, and its own variable; None: the prompt stays a template
    _pieces: tuple[tuple[tuple[str, str | None], ...], str] | None = field(init=False)
    #: the first job, checked against the Job schema whole: later ones are copies of it
    _template: Job | None = field(init=False, default=None)
    #: prompts made so far, by the values written into them (at most PROMPTS_KEPT)
    _prompts: dict[tuple[str, ...], str] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        texts = [t for t in (self.prompt, self.input) if t is not None]
        texts += [content for _role, content in self.messages or ()]
        names = _variable_names([p for t in texts for p in source_placeholders(t)])
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "_prompt", _to_template(self.prompt, names) if self.prompt else None)
        object.__setattr__(
            self,
            "_messages",
            tuple((r, _to_template(c, names)) for r, c in self.messages) if self.messages else None,
        )
        object.__setattr__(self, "_input", _to_template(self.input, names) if self.input else None)
        object.__setattr__(self, "_split", tuple((p, tuple(p.split("."))) for p in names))
        object.__setattr__(self, "_pieces", _pieces(self._prompt))

    def _prompt_of(self, variables: Mapping[str, str]) -> tuple[str, dict[str, str]]:
        """The job's prompt and variables. A prompt that ends with a placeholder keeps only that
        one: the others are written into its text (escaped, so a value stays text), so jobs
        whose other fields are equal share a prefix and can share a request (DESIGN rules 1
        and 2)."""
        if self._pieces is None:
            return self._prompt or "", dict(variables)
        pieces, trailing = self._pieces
        # records of one product share a prompt: the same text object each time, whose hash
        # the template caches downstream have computed once
        key = tuple(variables[name] for _literal, name in pieces if name is not None)
        text = self._prompts.get(key)
        if text is None:
            text = "".join(
                literal if name is None else literal + _as_text(variables[name]) for literal, name in pieces
            ) + "${" + trailing + "}"
            if len(self._prompts) < PROMPTS_KEPT:
                self._prompts[key] = text
        return text, {trailing: variables[trailing]}

    @property
    def paths(self) -> tuple[str, ...]:
        """The record's fields the job reads."""
        return tuple(self.names)

    def read_fields(self, row: Mapping[str, Any]) -> dict[str, str]:
        """What the job reads of `row`, path -> text; JobError naming the first missing field."""
        out = {}
        for path, parts in self._split:
            try:
                out[path] = _text(_get_parts(row, parts))
            except KeyError as exc:
                raise JobError(
                    ErrorKind.INVALID_JOB,
                    f"source {self.name!r}: the record has no field {path!r} (missing {exc.args[0]!r})",
                ) from None
        return out

    @staticmethod
    def fingerprint(read: Mapping[str, str]) -> str:
        """A digest of what the job read (equal for an update that changed nothing it reads):
        its fields' texts in the mapping's order, each prefixed by its length."""
        digest = hashlib.blake2b(digest_size=16)
        for text in read.values():
            data = text.encode()
            digest.update(b"%d:" % len(data))
            digest.update(data)
        return digest.hexdigest()

    def job_id(self, row: Mapping[str, Any], key: str | None, offset_ref: str) -> str:
        """The job's id: the record key (its offset reference for a record without one), its
        topic/partition/offset, or a field's value."""
        if self.id_from == "offset":
            return offset_ref
        if self.id_from == "key":
            return key if key else offset_ref
        try:
            value = get_path(row, self.id_from)
        except KeyError:
            raise JobError(
                ErrorKind.INVALID_JOB, f"source {self.name!r}: the record has no id field {self.id_from!r}"
            ) from None
        return _text(value)[:256] or offset_ref

    def job_of(
        self, row: Mapping[str, Any], read: Mapping[str, str], job_id: str, *, deadline: Any = None
    ) -> Job:
        """The job for `row` (`read`: `read_fields(row)`); `deadline`: the record's read time
        plus `deadline_s`, when the source sets one. JobError when it is not a valid job."""
        variables = {self.names[path]: text for path, text in read.items()}
        fields: dict[str, Any] = {
            "id": job_id[:256] or "-",
            "tier": self.tier,
            "kind": self.kind,
            "batch": self.batch,
            "options": dict(self.options),
            "mode": self.mode,
        }
        if self._prompt is not None:
            fields["prompt"], fields["variables"] = self._prompt_of(variables)
        elif self._messages is not None:
            fields["messages"] = [
                {"role": role, "content": _render(content, variables)} for role, content in self._messages
            ]
        else:
            fields["input"] = _render(self._input or "", variables)
        tenant = self.tenant
        if self.tenant_path is not None:
            try:
                tenant = _text(get_path(row, self.tenant_path))
            except KeyError:
                raise JobError(
                    ErrorKind.INVALID_JOB,
                    f"source {self.name!r}: the record has no tenant field {self.tenant_path!r}",
                ) from None
            if (problem := tenant_problem(tenant)) is not None:
                raise JobError(ErrorKind.INVALID_JOB, f"source {self.name!r}: tenant: {problem}")
        if tenant is not None:
            fields["tenant"] = tenant
        if deadline is not None:
            fields["deadline"] = deadline
        template = self._template
        if template is not None:
            # what varies per record is text this mapping made (an id of 1..256 characters,
            # the prompt and its variables, messages of the configured roles) or was checked
            # above (the tenant): the first job checked the rest against the Job schema
            if "messages" in fields:
                fields["messages"] = [Message.model_construct(**m) for m in fields["messages"]]
            return _copied_with(template, fields)
        try:
            job = job_from_fields(fields)
        except JobError as exc:
            raise JobError(ErrorKind.INVALID_JOB, f"source {self.name!r}: {exc}") from None
        object.__setattr__(self, "_template", job)
        return job


def _copied_with(template: Job, fields: dict[str, Any]) -> Job:
    """`template.model_copy(update=fields)` without its three generic `copy` calls (one job per
    record): the steps pydantic's own `__copy__` takes, for a model that forbids extra fields
    and has no private ones (tests/unit/test_sources.py holds the job equal to a validated one)."""
    job = Job.__new__(Job)
    values = template.__dict__.copy()
    values.update(fields)
    object.__setattr__(job, "__dict__", values)
    object.__setattr__(job, "__pydantic_extra__", None)
    object.__setattr__(job, "__pydantic_fields_set__", template.__pydantic_fields_set__ | fields.keys())
    object.__setattr__(job, "__pydantic_private__", None)
    return job


def _render(template: str, variables: Mapping[str, str]) -> str:
    """A message or input template with the variables it names substituted (the prompt stays a
    template: admission renders it, as for any job)."""
    names = set(placeholders(template))
    return render(template, {k: v for k, v in variables.items() if k in names})


#: the JSON Schema of the error object `on_error: field` writes beside a failed record's field
ANSWER_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"kind": {"type": "string"}, "message": {"type": "string"}},
    "required": ["kind", "message"],
}


def enriched_value(
    row: Mapping[str, Any], field_name: str, answer: Any, error: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The row written back: its own fields plus `field_name` holding the answer (a string, or
    the object a response_format gave); with `error` (on_error: field), the answer is null and
    `<field>_error` says why."""
    out = dict(row)
    out[field_name] = answer
    if error is not None:
        out[f"{field_name}_error"] = dict(error)
    return out

