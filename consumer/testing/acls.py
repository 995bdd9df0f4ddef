"""Set ACLs on a test broker (`kafka-local start --acl`) from Python, as its admin user.

aiokafka's protocol module has CreateAcls only at versions 0 and 1, which Kafka 4 no longer
takes; version 3 (the flexible encoding, what Kafka's own `kafka-acls.sh` sends) is declared
here with aiokafka's own protocol types and sent through its admin client. One request sets
every ACL of a test's setup, in a fraction of a second (a `kafka-acls.sh` run per principal and
resource costs a JVM start each).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import CompactArray, CompactString, Int8, Int16, Int32, Schema, TaggedFields

from consumer.kafka.acls import Acl

__all__ = ["create_acls"]

#: Kafka's AclResourceType, AclOperation, PatternType and AclPermissionType codes
RESOURCE_TYPES = {"Topic": 2, "Group": 3, "Cluster": 4, "TransactionalId": 5}
OPERATIONS = {
    "All": 2, "Read": 3, "Write": 4, "Create": 5, "Delete": 6, "Alter": 7, "Describe": 8,
    "ClusterAction": 9, "DescribeConfigs": 10, "AlterConfigs": 11, "IdempotentWrite": 12,
}
PATTERNS = {"literal": 3, "prefixed": 4}
ALLOW = 3


class CreateAclsResponse_v3(Response):
    API_KEY = 30
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "results",
            CompactArray(
                ("error_code", Int16), ("error_message", CompactString("utf-8")), ("tags", TaggedFields)
            ),
        ),
        ("tags", TaggedFields),
    )


class CreateAclsRequest_v3(RequestStruct):
    API_KEY = 30
    API_VERSION = 3
    FLEXIBLE_VERSION = True
    RESPONSE_TYPE = CreateAclsResponse_v3
    SCHEMA = Schema(
        (
            "creations",
            CompactArray(
                ("resource_type", Int8),
                ("resource_name", CompactString("utf-8")),
                ("resource_pattern_type", Int8),
                ("principal", CompactString("utf-8")),
                ("host", CompactString("utf-8")),
                ("operation", Int8),
                ("permission_type", Int8),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class CreateAclsRequest(Request[CreateAclsRequest_v3]):
    API_KEY = 30

    def __init__(self, creations: list[tuple[Any, ...]]) -> None:
        self._creations = creations

    def build(self, request_struct_class: type[CreateAclsRequest_v3]) -> CreateAclsRequest_v3:
        return request_struct_class([(*c, {}) for c in self._creations], {})


async def create_acls(admin_kwargs: dict[str, Any], grants: Sequence[tuple[str, Acl]]) -> None:
    """Allow each (user, acl) of `grants` (from any host), as the client `admin_kwargs` make
    (the broker's super user); RuntimeError naming the first ACL the broker refused."""
    creations = [
        (RESOURCE_TYPES[acl.resource_type], acl.name, PATTERNS[acl.pattern], f"User:{user}", "*", code, ALLOW)
        for user, acl in grants
        for code in (OPERATIONS[op] for op in acl.operations)
    ]
    admin = AIOKafkaAdminClient(**admin_kwargs)
    await admin.start()
    try:
        response = await admin._send_request(CreateAclsRequest(creations))
    finally:
        await admin.close()
    for creation, (code, message, _tags) in zip(creations, response.results, strict=True):
        if code != 0:
            raise RuntimeError(f"the broker refused ACL {creation}: error {code} {message}")
