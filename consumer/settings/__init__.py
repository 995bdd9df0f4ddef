"""Settings: the environment (pydantic-settings, prefix PROMPTBUS_) and the tier file (YAML).

Both are loaded once at startup, frozen, and passed down. A bad value stops startup with a
`ConfigError` naming the dotted key and the reason. One module per part, each importable from
here (`from consumer.settings import X` is the public path):

    environment.py  `Settings` (PROMPTBUS_*), `KafkaSecurity`, `load_settings`
    tierfile.py     `TierFile` (the top-level sections and the checks across them), reading it
                    (`load_tier_file`, `parse_tier_file`), `lane_topic`
    tiers.py        `TierConfig` and its sections (batching, limiter, retry, offline, fallback,
                    pricing)
    lanes.py        `LaneConfig` and the core's `Lane`s made from the `lanes` section
    tenants.py      `TenantConfig` and the core's `TenantPolicies` made from the `tenants` section
    quotas.py       `QuotaConfig`: one fleet quota of the `quotas` section
    base.py         `StrictModel`, the base of every tier-file model
    chart.py        `ChartValues`: the Helm chart's values (the source of its values.schema.json)
"""

from consumer.settings.chart import ChartValues
from consumer.settings.environment import KafkaSecurity, Settings, load_settings
from consumer.settings.lanes import LaneConfig
from consumer.settings.quotas import QuotaConfig
from consumer.settings.tenants import TenantBudgetConfig, TenantConfig
from consumer.settings.tierfile import (
    KeyedProblem,
    TierFile,
    lane_topic,
    load_tier_file,
    parse_tier_file,
    tenant_settings,
    unread_jobs_topic_note,
)
from consumer.settings.tiers import (
    DEFAULT_BASE_URLS,
    BatchingConfig,
    DeploymentConfig,
    FallbackConfig,
    LimiterConfig,
    OfflineConfig,
    PricingConfig,
    ProviderName,
    RetryConfig,
    TierConfig,
)

__all__ = [
    "DEFAULT_BASE_URLS",
    "BatchingConfig",
    "ChartValues",
    "DeploymentConfig",
    "FallbackConfig",
    "KafkaSecurity",
    "KeyedProblem",
    "LaneConfig",
    "LimiterConfig",
    "OfflineConfig",
    "PricingConfig",
    "ProviderName",
    "QuotaConfig",
    "RetryConfig",
    "Settings",
    "TenantBudgetConfig",
    "TenantConfig",
    "TierConfig",
    "TierFile",
    "lane_topic",
    "load_settings",
    "load_tier_file",
    "parse_tier_file",
    "tenant_settings",
    "unread_jobs_topic_note",
]
