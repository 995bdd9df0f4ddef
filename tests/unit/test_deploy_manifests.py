"""deploy/: the Kubernetes manifests load into the `kubernetes` package's typed models with no
field dropped; KEDA and Prometheus Operator objects (no typed models there) have the fields
their projects document as required; the alert rules have one source; promtool checks them
and runs their unit tests (a case per alert, firing and silent)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient

from consumer.settings import Settings
from consumer.testing.paths import REPO_ROOT

K8S = REPO_ROOT / "deploy" / "k8s"
RULES = REPO_ROOT / "deploy" / "prometheus" / "promptbus-rules.yml"
RULE_TESTS = REPO_ROOT / "deploy" / "prometheus" / "promptbus-rules.test.yml"

#: kinds with typed models in the kubernetes package: (apiVersion, kind) -> model class name
TYPED = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Secret"): "V1Secret",
    ("v1", "Service"): "V1Service",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
}
#: required fields (dotted paths) of the custom resources, as their projects document them:
#: KEDA ScaledObject spec, https://keda.sh/docs/2.16/reference/scaledobject-spec/ (scaleTargetRef.name,
#: triggers with type and metadata) and its Apache Kafka scaler,
#: https://keda.sh/docs/2.16/scalers/apache-kafka/ (bootstrapServers, consumerGroup; topic and
#: lagThreshold are optional there, but promptbus needs them set);
#: Prometheus Operator API reference, https://prometheus-operator.dev/docs/api-reference/api/
#: (ServiceMonitorSpec: selector, endpoints; PrometheusRuleSpec: groups, each with name and
#: rules, each rule with expr and alert or record)
REQUIRED = {
    ("keda.sh/v1alpha1", "ScaledObject"): ["metadata.name", "spec.scaleTargetRef.name", "spec.triggers"],
    ("monitoring.coreos.com/v1", "ServiceMonitor"): ["metadata.name", "spec.selector", "spec.endpoints"],
    ("monitoring.coreos.com/v1", "PrometheusRule"): ["metadata.name", "spec.groups"],
}
KAFKA_TRIGGER_REQUIRED = ["bootstrapServers", "consumerGroup", "topic", "lagThreshold"]


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def by_kind(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in documents() if d["kind"] == kind]
    return doc


def _get(doc: dict[str, Any], dotted: str) -> Any:
    value: Any = doc
    for part in dotted.split("."):
        assert isinstance(value, dict) and part in value, f"{doc['kind']}: {dotted} is missing"
        value = value[part]
    return value


def test_every_manifest_kind_is_checked_one_way_or_the_other() -> None:
    kinds = {(d["apiVersion"], d["kind"]) for d in documents()}
    assert kinds <= set(TYPED) | set(REQUIRED), f"unchecked kinds: {kinds - set(TYPED) - set(REQUIRED)}"
    assert set(REQUIRED) <= kinds


@pytest.mark.parametrize("doc", [d for d in documents() if (d["apiVersion"], d["kind"]) in TYPED], ids=repr)
def test_typed_manifests_round_trip_through_the_kubernetes_models(doc: dict[str, Any]) -> None:
    """An unknown or misspelt field is dropped by the model: the round trip then differs."""
    client = ApiClient()
    model = client._ApiClient__deserialize(doc, TYPED[(doc["apiVersion"], doc["kind"])])  # type: ignore[attr-defined]
    assert client.sanitize_for_serialization(model) == doc


def test_custom_resources_have_their_documented_required_fields() -> None:
    for doc in documents():
        for path in REQUIRED.get((doc["apiVersion"], doc["kind"]), []):
            assert _get(doc, path) not in (None, "", [], {}), f"{doc['kind']}: {path} is empty"
    for trigger in by_kind("ScaledObject")["spec"]["triggers"]:
        assert trigger["type"] == "kafka"
        for field in KAFKA_TRIGGER_REQUIRED:
            assert trigger["metadata"].get(field), f"kafka trigger: metadata.{field} is missing"
    for group in by_kind("PrometheusRule")["spec"]["groups"]:
        assert group["name"] and group["rules"]
        for rule in group["rules"]:
            assert rule.get("expr") and ("alert" in rule) != ("record" in rule), rule


def test_scaling_fits_the_partitions_and_the_lag_threshold_is_max_inflight() -> None:
    defaults = Settings.model_fields
    partitions = defaults["topic_partitions"].default
    assert partitions == 12
    scaled = by_kind("ScaledObject")["spec"]
    assert scaled["maxReplicaCount"] <= partitions
    (trigger,) = scaled["triggers"]
    # in-flight work counts as lag (commits follow outcomes): docs/metrics.md derives this
    assert int(trigger["metadata"]["lagThreshold"]) == defaults["max_inflight"].default
    deployment = by_kind("Deployment")
    target = scaled["scaleTargetRef"]["name"]
    assert target == deployment["metadata"]["name"]
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    ports = deployment["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert env["PROMPTBUS_METRICS_PORT"] == str(ports[0]["containerPort"]), "probes need the metrics server"
    selector = by_kind("PodDisruptionBudget")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def test_the_prometheus_rule_and_the_rule_file_are_one_source() -> None:
    plain = yaml.safe_load(RULES.read_text())
    assert by_kind("PrometheusRule")["spec"]["groups"] == plain["groups"], (
        "deploy/k8s/monitoring.yaml's PrometheusRule spec.groups must equal "
        "deploy/prometheus/promptbus-rules.yml"
    )


def _promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: run deploy/prometheus/install.sh (make venv does)"
    return path


def test_promtool_checks_the_rules_and_every_alert_has_a_unit_test() -> None:
    check = subprocess.run([_promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    groups = yaml.safe_load(RULES.read_text())["groups"]
    alerts = {r["alert"] for g in groups for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {a["alertname"] for t in tests for a in t["alert_rule_test"] if a["exp_alerts"]}
    silent = {a["alertname"] for t in tests for a in t["alert_rule_test"] if not a["exp_alerts"]}
    assert fired == alerts, f"alerts without a firing case: {alerts - fired}"
    assert silent == alerts, f"alerts without a silent case: {alerts - silent}"
    run = subprocess.run(
        [_promtool(), "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, cwd=RULE_TESTS.parent
    )
    assert run.returncode == 0, run.stdout + run.stderr
