"""The Helm chart from the tests and the tools: where `helm` is, `helm template` of the chart,
and `deploy/k8s/`, which is rendered from the chart's default values.

    python -m consumer.testing.chart            # write deploy/k8s/ from the chart
    python -m consumer.testing.chart --check    # exit 1 when deploy/k8s/ differs (drift)

`deploy/helm/install.sh` (run by `make venv`) builds Helm once per machine into `go env
GOPATH`/bin; `helm_binary` finds a Helm 4 there or on PATH.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from consumer.testing.paths import CHART, REPO_ROOT

__all__ = [
    "CRD_API_VERSIONS",
    "K8S_DIR",
    "REQUIRED",
    "TYPED",
    "check_manifest",
    "helm_binary",
    "k8s_manifests",
    "main",
    "manifests",
    "template",
]

#: the custom resources the chart renders when the cluster serves them (`helm template`
#: knows no cluster: `--api-versions` says which it has)
CRD_API_VERSIONS = (
    "keda.sh/v1alpha1/ScaledObject",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
)
K8S_DIR = REPO_ROOT / "deploy" / "k8s"

#: kinds with typed models in the kubernetes package: (apiVersion, kind) -> model class name
TYPED = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "Pod"): "V1Pod",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy",
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
_KAFKA_TRIGGER_REQUIRED = ["bootstrapServers", "consumerGroup", "topic", "lagThreshold"]
#: deploy/k8s/: the file -> the chart's templates it holds, and whether those need the CRDs
_K8S_FILES: dict[str, tuple[tuple[str, ...], bool]] = {
    "promptbus.yaml": (
        (
            "serviceaccount.yaml",
            "configmap.yaml",
            "service.yaml",
            "poddisruptionbudget.yaml",
            "deployment.yaml",
        ),
        False,
    ),
    "monitoring.yaml": (("scaledobject.yaml", "servicemonitor.yaml", "prometheusrule.yaml"), True),
}
_K8S_HEADER = {
    "promptbus.yaml": (
        "# promptbus on Kubernetes without Helm, rendered from deploy/helm/promptbus with its default\n"
        "# values (python -m consumer.testing.chart; a test fails when they differ: edit the chart).\n"
        "# Create the keys' Secret first, edit the tier file (ConfigMap) and\n"
        "# PROMPTBUS_KAFKA_BOOTSTRAP_SERVERS, then:\n"
        "#   kubectl create secret generic promptbus-keys --from-literal=OPENAI_API_KEY=...\n"
        "#   kubectl apply -f deploy/k8s/promptbus.yaml\n"
    ),
    "monitoring.yaml": (
        "# The objects of promptbus's chart that need custom resources: a KEDA ScaledObject on the\n"
        "# group's lag, a Prometheus Operator ServiceMonitor and PrometheusRule (the alert rules of\n"
        "# deploy/helm/promptbus/files/promptbus-rules.yml). Rendered from the chart like\n"
        "# promptbus.yaml; needs KEDA's and the Prometheus Operator's CRDs. docs/metrics.md explains them.\n"
    ),
}


@functools.cache
def helm_binary() -> str:
    """The Helm 4 `helm`: on PATH, else where deploy/helm/install.sh puts it. Fails (never
    skips) when there is none: the setup installs it."""
    candidates = [shutil.which("helm")]
    gopath = os.environ.get("GOPATH") or str(Path.home() / "go")
    go = shutil.which("go")
    if go:
        out = subprocess.run([go, "env", "GOPATH"], capture_output=True, text=True, check=False)
        gopath = out.stdout.strip().split(os.pathsep)[0] or gopath
    candidates.append(str(Path(gopath) / "bin" / "helm"))
    for path in candidates:
        if path and os.access(path, os.X_OK) and _is_helm4(path):
            return path
    raise AssertionError("helm 4 is missing: run deploy/helm/install.sh (make venv does)")


def _is_helm4(path: str) -> bool:
    out = subprocess.run(
        [path, "version", "--template", "{{.Version}}"], capture_output=True, text=True, check=False
    )
    return out.returncode == 0 and out.stdout.startswith("v4.")


def template(
    *values: Path,
    api_versions: Sequence[str] = (),
    show_only: Sequence[str] = (),
    release: str = "promptbus",
    sets: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """`helm template RELEASE deploy/helm/promptbus -f VALUES ...`, its output captured."""
    cmd = [helm_binary(), "template", release, str(CHART)]
    cmd += [arg for v in values for arg in ("-f", str(v))]
    cmd += [arg for a in api_versions for arg in ("--api-versions", a)]
    cmd += [arg for s in show_only for arg in ("--show-only", f"templates/{s}")]
    cmd += [arg for s in sets for arg in ("--set", s)]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def manifests(text: str) -> list[dict[str, Any]]:
    """The objects of rendered manifests (empty documents dropped)."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def check_manifest(doc: dict[str, Any]) -> None:
    """Assert one object is what Kubernetes reads: a kind with a typed model loads into it with
    no field dropped (a misspelt or misplaced field is dropped, so the round trip differs); a
    custom resource has the fields its project documents as required."""
    from kubernetes.client import ApiClient

    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in TYPED:
        client = ApiClient()
        model = client._ApiClient__deserialize(doc, TYPED[key])  # type: ignore[attr-defined]
        assert client.sanitize_for_serialization(model) == doc, f"{key}: a field the model does not know"
        return
    assert key in REQUIRED, f"unchecked kind {key}"
    for path in REQUIRED[key]:
        assert _get(doc, path) not in (None, "", [], {}), f"{doc['kind']}: {path} is empty"
    if doc["kind"] == "ScaledObject":
        for trigger in doc["spec"]["triggers"]:
            assert trigger["type"] == "kafka"
            for field in _KAFKA_TRIGGER_REQUIRED:
                assert trigger["metadata"].get(field), f"kafka trigger: metadata.{field} is missing"
    if doc["kind"] == "PrometheusRule":
        for group in doc["spec"]["groups"]:
            assert group["name"] and group["rules"]
            for rule in group["rules"]:
                assert rule.get("expr") and ("alert" in rule) != ("record" in rule), rule


def _get(doc: dict[str, Any], dotted: str) -> Any:
    value: Any = doc
    for part in dotted.split("."):
        assert isinstance(value, dict) and part in value, f"{doc['kind']}: {dotted} is missing"
        value = value[part]
    return value


def k8s_manifests() -> dict[str, str]:
    """deploy/k8s/'s files, rendered from the chart's default values."""
    out = {}
    for name, (templates, with_crds) in _K8S_FILES.items():
        run = template(api_versions=CRD_API_VERSIONS if with_crds else (), show_only=templates)
        if run.returncode != 0:
            raise RuntimeError(f"helm template failed: {run.stderr}")
        out[name] = _K8S_HEADER[name] + run.stdout.strip() + "\n"
    return out


def main(argv: list[str] | None = None) -> int:
    """Write deploy/k8s/ (or, with --check, compare it); returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m consumer.testing.chart", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on drift")
    args = parser.parse_args(argv)
    stale = []
    for name, text in k8s_manifests().items():
        path = K8S_DIR / name
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if args.check and stale:
        print(
            f"deploy/k8s out of date: {', '.join(stale)}; run: python -m consumer.testing.chart",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
