"""The Helm chart's values (`deploy/helm/promptbus/values.yaml`), as a model: the source of the
chart's `values.schema.json` (`consumer.schemas`), with which Helm refuses a bad value before
anything is applied.

Every field is required and has no default: the chart's values.yaml is the one place of the
defaults, and Helm validates the values merged over it, so a required field is only missing
when a user unset it. Two fields are filled in by `consumer.schemas` from the service's own
models: `tiers` (the tier file, `TierFile`) and `settings` (the environment, `Settings`).
Kubernetes objects the chart passes through as written (resources, tolerations, network
peers ...) are free-form mappings: the API server checks them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = ["ChartValues"]

#: `auto`: render the object when the cluster serves its custom resource (the CRD is installed)
Toggle = bool | Literal["auto"]
KubeObject = dict[str, Any]


class _Values(BaseModel):
    """Chart values are camelCase (Helm's convention); an unknown key is refused."""

    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)


class ImageValues(_Values):
    repository: str = Field(min_length=1, description="the promptbus image (the repository's Dockerfile)")
    tag: str = Field(min_length=1, description="its tag")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        description="the container's imagePullPolicy"
    )


class SecretEnvValues(_Values):
    """Variables from a Secret that exists already (the chart never holds a key)."""

    model_config = ConfigDict(json_schema_extra={"dependentRequired": {"key": ["env"], "env": ["key"]}})

    secret_name: str = Field(min_length=1, description="the Secret's name")
    key: str | None = Field(None, min_length=1, description="one key of it (with env); unset: every key")
    env: str | None = Field(None, min_length=1, description="the variable that key becomes (with key)")


class KafkaCAValues(_Values):
    secret_name: str = Field(description="a Secret holding the CA of the brokers' certificates; empty: none")
    key: str = Field(min_length=1, description="its key: the file PROMPTBUS_KAFKA__SSL_CAFILE names")


class MetricsValues(_Values):
    port: int = Field(ge=1, le=65535, description="PROMPTBUS_METRICS_PORT: /metrics, /healthz, /readyz")


class ServiceMonitorValues(_Values):
    enabled: Toggle = Field(description="a Prometheus Operator ServiceMonitor; auto: when its CRD exists")
    interval: str = Field(min_length=1, description="scrape interval")
    labels: dict[str, str] = Field(description="labels the Prometheus's serviceMonitorSelector wants")


class PrometheusRuleValues(_Values):
    enabled: Toggle = Field(description="the alert rules as a PrometheusRule; auto: when its CRD exists")
    labels: dict[str, str] = Field(description="labels the Prometheus's ruleSelector wants")


class AutoscalingValues(_Values):
    enabled: Toggle = Field(
        description="a KEDA ScaledObject on the group's lag; auto: when KEDA's CRD exists"
    )
    min_replicas: int = Field(ge=0, description="minReplicaCount")
    max_replicas: int = Field(ge=1, description="maxReplicaCount: at most the jobs topic's partitions")
    polling_interval: int = Field(ge=1, description="seconds between two lag reads")
    cooldown_period: int = Field(ge=0, description="seconds before scaling to minReplicas")
    lag_threshold: int | None = Field(None, ge=1, description="lag per replica; unset: settings.max_inflight")
    activation_lag_threshold: int = Field(ge=0, description="lag that wakes a scaled-to-zero group")
    offset_reset_policy: Literal["earliest", "latest"] = Field(description="the kafka trigger's")
    authentication_ref: str = Field(
        description="a KEDA TriggerAuthentication (SASL, TLS) for the lag reads; empty: none"
    )
    trigger_metadata: dict[str, str] = Field(description="more kafka-trigger metadata (sasl, tls ...)")


class PodDisruptionBudgetValues(_Values):
    enabled: bool
    max_unavailable: int | str = Field(description="pods a voluntary disruption may take at once")


class ServiceAccountValues(_Values):
    create: bool = Field(description="create it; false: use `name` (or the namespace's default)")
    name: str = Field(description="its name; empty: the release's full name")
    annotations: dict[str, str]


class EgressValues(_Values):
    """One egress rule of the NetworkPolicy: its peers and ports, as Kubernetes writes them."""

    to: list[KubeObject] = Field(description="NetworkPolicyPeers (ipBlock, namespace or pod selectors)")
    ports: list[KubeObject] = Field(min_length=1, description="NetworkPolicyPorts")


class NetworkPolicyValues(_Values):
    enabled: bool
    brokers: EgressValues = Field(description="the Kafka brokers (and the Schema Registry)")
    providers: EgressValues = Field(description="the model providers' hosts, or the egress proxy")
    dns: EgressValues = Field(description="the cluster's DNS")
    extra_egress: list[KubeObject] = Field(description="more NetworkPolicyEgressRules, as written")
    metrics_from: list[KubeObject] = Field(description="peers that may scrape the metrics port; []: any")


class ChartValues(_Values):
    """The values of `deploy/helm/promptbus` (its values.yaml says what each one does)."""

    image: ImageValues
    image_pull_secrets: list[KubeObject]
    replica_count: int = Field(ge=0, description="instances, when no ScaledObject scales them")
    workload: Literal["Deployment", "StatefulSet"] = Field(
        description="the pods' controller; StatefulSet: each pod's name is its static group membership"
    )
    tiers: KubeObject = Field(description="the tier file (filled in from TierFile)")
    lane_order: list[str] = Field(description="the lanes' names, highest priority first")
    settings: KubeObject = Field(description="the environment settings (filled in from Settings)")
    secret_env: list[SecretEnvValues]
    kafka_ca: KafkaCAValues = Field(alias="kafkaCA")
    metrics: MetricsValues
    service_monitor: ServiceMonitorValues
    prometheus_rule: PrometheusRuleValues
    autoscaling: AutoscalingValues
    pod_disruption_budget: PodDisruptionBudgetValues
    service_account: ServiceAccountValues
    network_policy: NetworkPolicyValues
    pre_stop_sleep_seconds: int = Field(ge=0, description="the preStop sleep; 0: none")
    termination_margin_seconds: int = Field(
        ge=0, description="terminationGracePeriodSeconds beyond the preStop, shutdown and revoke bounds"
    )
    resources: KubeObject
    pod_annotations: dict[str, str]
    pod_labels: dict[str, str]
    pod_security_context: KubeObject
    security_context: KubeObject
    node_selector: dict[str, str]
    tolerations: list[KubeObject]
    affinity: KubeObject
    global_: KubeObject = Field(
        default_factory=dict, alias="global", description="an umbrella chart's global values (unused)"
    )
