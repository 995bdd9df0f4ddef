"""deploy/: the Kubernetes manifests (rendered from the Helm chart: tests/unit/test_helm_chart.py
keeps them equal) load into the `kubernetes` package's typed models with no field dropped;
KEDA and Prometheus Operator objects (no typed models there) have the fields their projects
document as required; the alert rules have one source; promtool checks them and runs their
unit tests (a case per alert, firing and silent)."""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

import pytest
import yaml

from consumer.settings import Settings
from consumer.testing.chart import REQUIRED, TYPED, check_manifest
from consumer.testing.paths import ALERT_RULES, REPO_ROOT

K8S = REPO_ROOT / "deploy" / "k8s"
RULES = ALERT_RULES
RULE_TESTS = REPO_ROOT / "deploy" / "prometheus" / "promptbus-rules.test.yml"


def documents() -> list[dict[str, Any]]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def by_kind(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in documents() if d["kind"] == kind]
    return doc


def test_every_manifest_kind_is_checked_one_way_or_the_other() -> None:
    kinds = {(d["apiVersion"], d["kind"]) for d in documents()}
    assert kinds <= set(TYPED) | set(REQUIRED), f"unchecked kinds: {kinds - set(TYPED) - set(REQUIRED)}"
    assert set(REQUIRED) <= kinds


@pytest.mark.parametrize("doc", documents(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_manifests_are_what_kubernetes_reads(doc: dict[str, Any]) -> None:
    """Typed kinds round-trip through their models; custom resources have their required fields."""
    check_manifest(doc)


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
        "deploy/k8s/monitoring.yaml's PrometheusRule spec.groups must be the chart's "
        "files/promptbus-rules.yml (render deploy/k8s again: python -m consumer.testing.chart)"
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
