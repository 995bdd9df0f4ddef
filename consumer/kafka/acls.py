"""The Kafka ACLs a principal needs (docs/operations.md#security): promptbus's own, and a bound
tenant's team. Pure: the list is computed from the settings and the tier file, printed by
`promptbus check-config --acls` as `kafka-acls.sh` commands, and applied as written by the
ACL integration test (tests/integration/test_tenant_acls.py), so the documented list is the
one a broker with an authorizer has been shown to need.

promptbus (PROMPTBUS_KAFKA__SASL_USERNAME):

    Topic, each job topic (a lane's, the jobs topic, a source's)      Read, Describe
    Topic, each results and dead-letter topic (the service's and
           every tenant's), each source's enriched topic              Write, Describe, DescribeConfigs
    Topic, its own topics (batches, stats, batching, quotas,
           budgets, handover, enrichments)                            Read, Write, Describe, DescribeConfigs
    Group, prefixed PROMPTBUS_GROUP_ID                                Read
    TransactionalId, prefixed PROMPTBUS_GROUP_ID (exactly_once)       Write, Describe

plus Create on the topics it should create at start (none when they are made beforehand:
every topic it has Describe on and finds is left as it is).

A bound tenant's team: Write, Describe on its job topics; Read, Describe on its own results
and dead-letter topics (the client and `promptbus results` read them assigned, without a
group). A topic it shares with other tenants (the service's, when it has none of its own) is
left out: reading it would be reading theirs (`shared_outputs` says which; check-config notes
them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from consumer.settings import Settings, TierFile

__all__ = ["Acl", "acl_command", "service_acls", "shared_outputs", "tenant_acls"]

#: what a topic promptbus reads jobs from needs
JOB_TOPIC_OPERATIONS = ("Read", "Describe")
#: what a topic promptbus writes outcomes to needs (DescribeConfigs: its max.message.bytes)
OUTPUT_TOPIC_OPERATIONS = ("Write", "Describe", "DescribeConfigs")
#: what promptbus's own compacted topics need: it writes them and reads them back
OWN_TOPIC_OPERATIONS = ("Read", "Write", "Describe", "DescribeConfigs")


@dataclass(frozen=True, slots=True)
class Acl:
    """One allow rule: `operations` on the resource (`resource_type` Topic, Group, or
    TransactionalId; `name`, matched `literal`ly or as a `prefixed` name)."""

    resource_type: str
    name: str
    operations: tuple[str, ...]
    pattern: str = "literal"


def service_acls(settings: Settings, tier_file: TierFile) -> list[Acl]:
    """The ACLs promptbus's principal needs for this configuration (see the module's table)."""
    lanes = tier_file.lane_list(settings.jobs_topic, settings.max_inflight)
    sources = list((tier_file.sources or {}).values())
    job_topics = [lane.topic for lane in lanes] + [s.topic for s in sources]
    tenants = tier_file.tenant_topics(settings.results_topic, settings.dlq_topic)
    outputs = [*tenants.output_topics, *(s.into.topic for s in sources)]
    own = [
        settings.batches_topic,
        settings.stats_topic,
        settings.batching_topic,
        settings.quotas_topic,
        settings.budgets_topic,
        settings.handover_topic,
        *([settings.enrichments_topic] if sources else []),
    ]
    acls = [
        *_topics(job_topics, JOB_TOPIC_OPERATIONS),
        *_topics(outputs, OUTPUT_TOPIC_OPERATIONS),
        *_topics(own, OWN_TOPIC_OPERATIONS),
        Acl("Group", settings.group_id, ("Read",), "prefixed"),
    ]
    if settings.processing_guarantee == "exactly_once":
        acls.append(Acl("TransactionalId", settings.group_id, ("Write", "Describe"), "prefixed"))
    return acls


def tenant_acls(settings: Settings, tier_file: TierFile, tenant: str) -> list[Acl]:
    """The ACLs a bound tenant's own principal needs: write its job topics, read its outcomes."""
    config = (tier_file.tenants or {}).get(tenant)
    if config is None or not config.topics:
        raise ValueError(f"tenant {tenant!r} is not bound to topics in the tier file")
    shared = shared_outputs(settings, tier_file, tenant)
    tenants = tier_file.tenant_topics(settings.results_topic, settings.dlq_topic)
    outputs = [t for t in (tenants.results_of(tenant), tenants.dead_letters_of(tenant)) if t not in shared]
    return [*_topics(config.topics, ("Write", "Describe")), *_topics(outputs, ("Read", "Describe"))]


def shared_outputs(settings: Settings, tier_file: TierFile, tenant: str) -> list[str]:
    """`tenant`'s results and dead-letter topics that other tenants' outcomes go to as well."""
    tenants = tier_file.tenant_topics(settings.results_topic, settings.dlq_topic)
    others = [name for name in (tier_file.tenants or {}) if name != tenant]
    shared = []
    for of in (tenants.results_of, tenants.dead_letters_of):
        topic = of(tenant)
        service = settings.results_topic if of == tenants.results_of else settings.dlq_topic
        if topic == service or any(of(other) == topic for other in others):
            shared.append(topic)
    return shared


def _topics(names: Iterable[str], operations: Sequence[str]) -> list[Acl]:
    return [Acl("Topic", name, tuple(operations)) for name in dict.fromkeys(names)]


#: kafka-acls.sh's option of each resource type
_RESOURCE_OPTION = {"Topic": "--topic", "Group": "--group", "TransactionalId": "--transactional-id"}


def acl_command(principal: str, acl: Acl) -> list[str]:
    """The arguments of `kafka-acls.sh` (Kafka's `AclCommand`) that add `acl` for `principal`
    (a user name), after `--bootstrap-server` and `--command-config`."""
    args = ["--add", "--allow-principal", f"User:{principal}"]
    for operation in acl.operations:
        args += ["--operation", operation]
    args += [_RESOURCE_OPTION[acl.resource_type], acl.name]
    if acl.pattern != "literal":
        args += ["--resource-pattern-type", acl.pattern]
    return args
