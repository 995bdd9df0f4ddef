"""Where the test tools find the repository and the `promptbus` command.

The tools run from a checkout (the local Kafka script and the examples are not in the
installed package): `REPO_ROOT` is the checkout holding this package.
"""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["ALERT_RULES", "CHART", "KAFKA_SCRIPT", "PROMPTBUS", "REPO_ROOT"]

#: the checkout: `consumer/`, `deploy/`, `docs/`, `examples/`, `schemas/` ...
REPO_ROOT = Path(__file__).resolve().parents[2]
#: the local broker and cluster script (`deploy/kafka-local/kafka`)
KAFKA_SCRIPT = REPO_ROOT / "deploy" / "kafka-local" / "kafka"
#: the Helm chart (`deploy/k8s/` is rendered from it)
CHART = REPO_ROOT / "deploy" / "helm" / "promptbus"
#: the alert rules, one file: a plain Prometheus rule file, and the chart's PrometheusRule spec
ALERT_RULES = CHART / "files" / "promptbus-rules.yml"
#: the `promptbus` command of this interpreter (the installed entry point need not be on PATH)
PROMPTBUS = (sys.executable, "-m", "consumer.cli")
