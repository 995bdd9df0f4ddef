"""Sources' pure core: a decoded record as a job, its change, its fields, its enriched value."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from consumer.core.content import job_content, merged_options
from consumer.core.errors import ErrorKind, JobError
from consumer.core.jobs import Job
from consumer.core.sources import SourceMapping, change_of, enriched_value, get_path, mapping_problem
from consumer.settings.sources import SourceConfig


def mapping(**fields: Any) -> SourceMapping:
    config = SourceConfig.model_validate(
        {"topic": "in", "tier": "small", "into": {"topic": "out", "field": "answer"}, **fields}
    )
    return config.mapping("s")


def test_paths_read_nested_fields_and_list_items() -> None:
    row = {"a": {"b": [{"c": 1}, {"c": "two"}]}}
    assert get_path(row, "a.b.1.c") == "two"
    with pytest.raises(KeyError, match="x"):
        get_path(row, "a.x")
    with pytest.raises(KeyError):
        get_path(row, "a.b.5")


def test_debezium_changes() -> None:
    assert change_of({"op": "c", "after": {"id": 1}}, "debezium").row == {"id": 1}
    assert change_of({"op": "r", "after": {"id": 1}}, "debezium").op == "r"
    assert change_of({"schema": {}, "payload": {"op": "u", "after": {"id": 2}}}, "debezium").row == {"id": 2}
    assert change_of({"op": "d", "before": {"id": 1}, "after": None}, "debezium").row is None
    assert change_of(None, "debezium").row is None and change_of(None, "none").row is None
    for bad, message in (
        ({"op": "u", "after": None}, "without 'after'"),
        ({"after": {}}, "no 'op'"),
        ({"op": "t"}, "carries no row"),
    ):
        with pytest.raises(JobError, match=message):
            change_of(bad, "debezium")
    with pytest.raises(JobError, match="not an object"):
        change_of([1, 2], "none")


def test_a_prompt_ending_with_a_placeholder_keeps_only_that_one() -> None:
    m = mapping(prompt="About ${product.name} ($${literal}):\n${review.text}", batch=True)
    row = {"product": {"name": "kettle ${x}"}, "review": {"text": "good"}}
    job = m.job_of(row, m.read_fields(row), "k1")
    assert job.prompt == "About kettle $${x} ($${literal}):\n${review__text}"
    assert job.variables == {"review__text": "good"}
    content = job_content(job, merged=merged_options(job, {}))
    assert content.batchable is not None and content.batchable.variable == "review__text"
    assert content.text == "good"


@given(
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.text(alphabet="x${}$ ab", max_size=12), min_size=3),
)
def test_the_job_renders_as_the_values_substituted_whatever_they_hold(values: dict[str, str]) -> None:
    """Values are text: a `${...}` inside one never becomes a placeholder."""
    m = mapping(prompt="A ${a} B ${b}\nDATA:\n${c}")
    job = m.job_of(values, m.read_fields(values), "k")
    content = job_content(job, merged=merged_options(job, {}))
    assert content.batchable is not None
    rendered = content.batchable.prefix + content.text
    assert rendered == f"A {values['a']} B {values['b']}\nDATA:\n{values['c']}"


def test_messages_and_embed_sources_and_their_problems() -> None:
    m = mapping(messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "${q}"}])
    job = m.job_of({"q": "why?"}, m.read_fields({"q": "why?"}), "k")
    assert [(x.role, x.content) for x in job.messages or []] == [("system", "Be brief."), ("user", "why?")]
    e = mapping(kind="embed", input="${title}: ${body}")
    row = {"title": "T", "body": 3}
    assert e.job_of(row, e.read_fields(row), "k").input == "T: 3"
    base = {"kind": "chat", "prompt": None, "messages": None, "input": None}
    assert "exactly one of prompt or messages" in (mapping_problem(base) or "")
    assert "reads nothing" in (mapping_problem({**base, "prompt": "no placeholder"}) or "")


def test_a_missing_field_names_it_and_ids_and_tenants_come_from_the_record() -> None:
    m = mapping(prompt="X:\n${review.text}", id="review.id", tenant={"field": "team"})
    with pytest.raises(JobError, match=r"no field 'review.text' \(missing 'text'\)") as caught:
        m.read_fields({"review": {}})
    assert caught.value.kind is ErrorKind.INVALID_JOB
    row = {"review": {"text": "t", "id": 42}, "team": "search"}
    job = m.job_of(row, m.read_fields(row), m.job_id(row, "key", "in/0/1"))
    assert job.id == "42" and job.tenant == "search"
    with pytest.raises(JobError, match="tenant"):
        bad = {"review": {"text": "t", "id": 1}, "team": "not a tenant name!"}
        m.job_of(bad, m.read_fields(bad), "k")
    assert mapping(prompt="X:\n${a}", id="offset").job_id({}, "key", "in/0/1") == "in/0/1"
    assert mapping(prompt="X:\n${a}").job_id({}, None, "in/0/1") == "in/0/1"


def test_the_read_digest_changes_only_with_what_the_prompt_reads() -> None:
    m = mapping(prompt="X:\n${review.text}")
    one = m.fingerprint(m.read_fields({"review": {"text": "a"}, "stars": 1}))
    assert one == m.fingerprint(m.read_fields({"review": {"text": "a"}, "stars": 5}))
    assert one != m.fingerprint(m.read_fields({"review": {"text": "b"}, "stars": 1}))


def test_the_enriched_value_is_the_row_plus_the_field() -> None:
    row = {"id": 1}
    assert enriched_value(row, "answer", {"label": "x"}) == {"id": 1, "answer": {"label": "x"}}
    failed = enriched_value(row, "answer", None, {"kind": "retries_exhausted", "message": "m"})
    assert failed == {"id": 1, "answer": None, "answer_error": {"kind": "retries_exhausted", "message": "m"}}
    assert row == {"id": 1}


def test_a_source_takes_every_mode_and_refuses_its_own_topic_as_output() -> None:
    for mode in ("online", "offline", "auto"):
        assert mapping(prompt="X:\n${a}", mode=mode).mode == mode
    with pytest.raises(ValueError, match="must differ"):
        SourceConfig.model_validate({"topic": "t", "tier": "s", "prompt": "${a}", "into": {"topic": "t"}})


@given(values=st.lists(st.tuples(st.text(max_size=20), st.text(max_size=20)), min_size=2, max_size=5))
def test_every_job_after_the_first_is_the_job_validation_would_give(values: list[tuple[str, str]]) -> None:
    """The first job of a mapping is validated; the others copy it with what varies."""
    shapes = (
        {"prompt": "About ${p}:\n${t}", "batch": True},
        {"messages": [{"role": "user", "content": "${p} ${t}"}]},
    )
    for shape in shapes:
        m = mapping(**shape, tenant={"field": "p"}, deadline_s=5)
        first = None
        for i, (p, t) in enumerate(values):
            row = {"p": f"team{i}", "t": t + p}
            job = m.job_of(row, m.read_fields(row), f"id-{i}", deadline=None)
            validated = Job.model_validate(job.model_dump())
            assert job == validated and job.model_dump_json() == validated.model_dump_json()
            first = first or job
            assert job.model_fields_set == first.model_fields_set  # the same fields given each time
            with pytest.raises(ValidationError):
                job.id = "changed"  # frozen, as any job
