"""deploy/helm/promptbus: `helm lint`; `helm template` of the default values and of each values
file in examples/helm/, with and without the custom resources' CRDs, every object loaded
into the Kubernetes models (as deploy/k8s/'s are) and its tier file and environment taken by
`promptbus check-config`; values.schema.json refusing a tier-file mistake with Helm's own
error naming the key; the graceful rollout (grace period, probes, preStop, the `helm test`
pod); deploy/k8s/ rendered from the chart.

Helm is the one `deploy/helm/install.sh` builds (`make venv`): without it these tests fail.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from consumer.cli import main
from consumer.settings import Settings
from consumer.testing.chart import (
    CRD_API_VERSIONS,
    K8S_DIR,
    check_manifest,
    helm_binary,
    k8s_manifests,
    manifests,
    template,
)
from consumer.testing.paths import ALERT_RULES, CHART, REPO_ROOT
from consumer.yaml12 import load_yaml

EXAMPLES = sorted((REPO_ROOT / "examples" / "helm").glob("*.yaml"))
#: each case's objects (kind/name) with the CRDs served and without
BASE = {
    "ServiceAccount/promptbus",
    "ConfigMap/promptbus-tiers",
    "Service/promptbus",
    "PodDisruptionBudget/promptbus",
    "Deployment/promptbus",
    "Pod/promptbus-check-config",
}
MONITORING = {"ServiceMonitor/promptbus", "PrometheusRule/promptbus"}
SCALING = {"ScaledObject/promptbus"}
EXPECTED: dict[str, tuple[set[str], set[str]]] = {
    "default": (BASE | MONITORING | SCALING, BASE),
    "fleet.yaml": (BASE | MONITORING | SCALING, BASE | SCALING),
    "local-model.yaml": (BASE | MONITORING, BASE),
    "sasl-ssl-proxy.yaml": (
        BASE | MONITORING | SCALING | {"NetworkPolicy/promptbus"},
        BASE | SCALING | {"NetworkPolicy/promptbus"},
    ),
}
CASES = [("default", ()), *((p.name, (p,)) for p in EXAMPLES)]


def render(*values: Path, crds: bool = True, sets: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    run = template(*values, api_versions=CRD_API_VERSIONS if crds else (), sets=sets)
    assert run.returncode == 0, run.stderr
    return manifests(run.stdout)


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def container(docs: list[dict[str, Any]], kind: str = "Deployment") -> dict[str, Any]:
    doc = one(docs, kind)
    spec = doc["spec"]["template"]["spec"] if kind == "Deployment" else doc["spec"]
    first: dict[str, Any] = spec["containers"][0]
    return first


def bad_values(tmp_path: Path, text: str) -> str:
    """Helm's error for a values file: `helm template` must refuse it."""
    path = tmp_path / "values.yaml"
    path.write_text(text, encoding="utf-8")
    run = template(path)
    assert run.returncode != 0, f"helm took:\n{text}"
    return run.stderr


def test_the_examples_are_the_three_of_the_issue() -> None:
    assert {p.name for p in EXAMPLES} == set(EXPECTED) - {"default"}


def test_helm_lint_takes_the_chart_with_each_values_file() -> None:
    import subprocess

    for values in [(), *((str(p),) for p in EXAMPLES)]:
        cmd = [helm_binary(), "lint", "--strict", str(CHART), *(a for v in values for a in ("-f", v))]
        run = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("crds", [True, False], ids=["crds", "no-crds"])
@pytest.mark.parametrize(("case", "values"), CASES, ids=[c for c, _ in CASES])
def test_every_rendered_object_is_what_kubernetes_reads(
    case: str, values: tuple[Path, ...], crds: bool
) -> None:
    docs = render(*values, crds=crds)
    names = {f"{d['kind']}/{d['metadata']['name']}" for d in docs}
    assert names == EXPECTED[case][0 if crds else 1]
    for doc in docs:
        check_manifest(doc)
    scaled = any(d["kind"] == "ScaledObject" for d in docs)
    assert ("replicas" in one(docs, "Deployment")["spec"]) != scaled, (
        "KEDA or replicas set the count, not both"
    )
    assert not any(d["kind"] == "Secret" for d in docs), "keys come from existing Secrets only"


@pytest.mark.parametrize(("case", "values"), CASES, ids=[c for c, _ in CASES])
def test_check_config_takes_the_rendered_tier_file_with_the_rendered_environment(
    case: str,
    values: tuple[Path, ...],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """What the `helm test` pod runs, here: the ConfigMap's file, the container's variables
    (a Secret's as a placeholder, as the pod would have them)."""
    docs = render(*values)
    path = tmp_path / "tiers.yaml"
    path.write_text(one(docs, "ConfigMap")["data"]["tiers.yaml"], encoding="utf-8")
    test_pod = container(docs, "Pod")
    assert test_pod["args"] == ["check-config", "--config", "/config/tiers.yaml"]
    assert test_pod["env"] == container(docs)["env"] and test_pod.get("envFrom") == container(docs).get(
        "envFrom"
    )
    for env in test_pod["env"]:
        monkeypatch.setenv(env["name"], env.get("value", "placeholder-secret"))
    tiers = load_yaml(path.read_text(encoding="utf-8"))["tiers"]
    for tier in tiers.values():
        if tier.get("api_key_env") and "envFrom" in test_pod:
            monkeypatch.setenv(tier["api_key_env"], "placeholder-key")
    monkeypatch.delenv("PROMPTBUS_CONFIG", raising=False)
    code = main(["check-config", "--config", str(path)])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err
    assert f"ok: {len(tiers)} tier(s)" in out.out


def test_a_tier_file_mistake_is_refused_by_the_schema_naming_the_key(tmp_path: Path) -> None:
    err = bad_values(
        tmp_path,
        "tiers:\n"
        "  quotas:\n"
        "    openai-mini: {requests_per_minut: 5000}\n"
        "  tiers:\n"
        "    small: {provider: openai, model: gpt-4o-mini, api_key_env: OPENAI_API_KEY, limitr: {max: 8}}\n"
        "    big: {provider: openai, model: gpt-4o, api_key_env: K, limiter: {algorithm: aimdx}}\n",
    )
    assert "values don't meet the specifications of the schema" in err
    assert "at '/tiers/tiers/small': additional properties 'limitr' not allowed" in err
    assert "at '/tiers/tiers/big/limiter/algorithm': value must be one of 'aimd', 'gradient', 'fixed'" in err
    assert "at '/tiers/quotas/openai-mini': additional properties 'requests_per_minut' not allowed" in err


def test_an_unknown_setting_a_password_or_a_chart_key_is_refused(tmp_path: Path) -> None:
    assert "additional properties 'max_inflite' not allowed" in bad_values(
        tmp_path, "settings: {max_inflite: 5}\n"
    )
    err = bad_values(tmp_path, "settings: {kafka: {sasl_password: hunter2}}\n")
    assert "at '/settings/kafka': additional properties 'sasl_password' not allowed" in err
    assert "additional properties 'replicaCunt' not allowed" in bad_values(tmp_path, "replicaCunt: 3\n")
    assert "'env'" in bad_values(tmp_path, "secretEnv: [{secretName: keys, key: api-key}]\n")


def test_lanes_are_written_in_lane_order_and_refused_without_it(tmp_path: Path) -> None:
    fleet = REPO_ROOT / "examples" / "helm" / "fleet.yaml"
    tier_file = load_yaml(one(render(fleet), "ConfigMap")["data"]["tiers.yaml"])
    assert list(tier_file["lanes"]) == yaml.safe_load(fleet.read_text())["laneOrder"]
    run = template(fleet, sets=("laneOrder={standard,bulk}",))
    assert run.returncode != 0
    assert (
        'laneOrder: ["standard","bulk"] must name the lanes ["bulk","interactive","standard"]' in run.stderr
    )


def test_a_changed_tier_file_changes_the_pods_checksum() -> None:
    def checksum(*sets: str) -> str:
        annotations = one(render(sets=sets), "Deployment")["spec"]["template"]["metadata"]["annotations"]
        value: str = annotations["checksum/tiers"]
        return value

    same = checksum()
    assert checksum() == same
    local = ("tiers.tiers.local.provider=openai_compat", "tiers.tiers.local.base_url=http://m:8080/v1")
    assert checksum(*local, "tiers.tiers.local.model=a") != same
    assert checksum(*local, "tiers.tiers.local.model=a") != checksum(*local, "tiers.tiers.local.model=b")


@pytest.mark.parametrize(
    "values",
    ["{}", "{settings: {shutdown_timeout_s: 120.5, revoke_timeout_s: 45}, preStopSleepSeconds: 0}"],
    ids=["default", "long-timeouts-no-prestop"],
)
def test_the_grace_period_outlasts_the_prestop_the_shutdown_and_the_revoke(
    values: str, tmp_path: Path
) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(values, encoding="utf-8")
    docs = render(path)
    spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in container(docs)["env"]}
    shutdown_s = float(env["PROMPTBUS_SHUTDOWN_TIMEOUT_S"])
    revoke_s = float(env["PROMPTBUS_REVOKE_TIMEOUT_S"])
    pre_stop = container(docs).get("lifecycle", {}).get("preStop")
    sleep_s = pre_stop["sleep"]["seconds"] if pre_stop else 0
    # the drain, its final flush (at most min(shutdown, 10) s), the revoke on leaving the group
    needed_s = sleep_s + shutdown_s + min(shutdown_s, 10) + revoke_s
    assert spec["terminationGracePeriodSeconds"] > math.ceil(needed_s)
    assert (pre_stop is None) == ("preStopSleepSeconds: 0" in values)
    if pre_stop:
        assert set(pre_stop) == {"sleep"}, "the preStop needs no shell nor binary in the image"
    assert container(docs)["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_settings_render_as_the_variables_promptbus_reads() -> None:
    docs = render(REPO_ROOT / "examples" / "helm" / "sasl-ssl-proxy.yaml")
    env = {e["name"]: e for e in container(docs)["env"]}
    assert env["PROMPTBUS_KAFKA__SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
    assert env["PROMPTBUS_KAFKA__SSL_CAFILE"]["value"] == "/etc/promptbus/kafka-ca/ca.crt"
    ref = {"secretKeyRef": {"name": "kafka-sasl", "key": "password"}}
    assert env["PROMPTBUS_KAFKA__SASL_PASSWORD"] == {
        "name": "PROMPTBUS_KAFKA__SASL_PASSWORD",
        "valueFrom": ref,
    }
    big = render(sets=("settings.max_job_bytes=4194304",))
    assert {"name": "PROMPTBUS_MAX_JOB_BYTES", "value": "4194304"} in container(big)["env"], (
        "digits, not 4.194304e+06"
    )


def test_the_values_settings_are_promptbus_defaults_but_where_the_chart_says_otherwise() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chosen = {"kafka_bootstrap_servers": "kafka:9092", "topic_replication": 3}
    for name, value in values["settings"].items():
        default = chosen.get(name, Settings.model_fields[name].default)
        assert value == default, f"settings.{name}: {value!r}, promptbus's default is {default!r}"
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["appVersion"] == pyproject["project"]["version"]


def test_the_prometheus_rule_is_the_rule_file() -> None:
    rule = one(render(), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(ALERT_RULES.read_text())


def test_deploy_k8s_is_rendered_from_the_chart() -> None:
    for name, text in k8s_manifests().items():
        path = K8S_DIR / name
        assert path.read_text(encoding="utf-8") == text, (
            f"deploy/k8s/{name} differs from the chart's rendering; run: python -m consumer.testing.chart"
        )
    assert {p.name for p in K8S_DIR.glob("*.yaml")} == set(k8s_manifests())


def test_a_statefulset_gives_each_pod_its_name_as_static_membership(tmp_path: Path) -> None:
    """`workload: StatefulSet`: the pods' stable names are their PROMPTBUS_INSTANCE_ID (read from
    the downward API, one per pod), KEDA scales the StatefulSet, and `settings.instance_id` is
    refused (one value for every pod would have each fence the others)."""
    docs = render(sets=("workload=StatefulSet",))
    for doc in docs:
        check_manifest(doc)
    assert not any(d["kind"] == "Deployment" for d in docs)
    workload = one(docs, "StatefulSet")
    assert workload["spec"]["podManagementPolicy"] == "Parallel"
    (pod,) = workload["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in pod["env"]}
    assert env["PROMPTBUS_INSTANCE_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert one(docs, "ScaledObject")["spec"]["scaleTargetRef"] == {"kind": "StatefulSet", "name": "promptbus"}
    default = render()
    assert "PROMPTBUS_INSTANCE_ID" not in {e["name"] for e in container(default)["env"]}
    assert "additional properties 'instance_id' not allowed" in bad_values(
        tmp_path, "settings: {instance_id: promptbus-0}\n"
    )
