"""`promptbus stats`: the latest snapshot of every instance, merged (`consumer.core.snapshots`),
and every line of its text form."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

import orjson

from consumer.cli.environment import add_bootstrap, configure_logging, kafka_settings
from consumer.core.cost import BatchSaving
from consumer.core.errors import UsageError
from consumer.core.snapshots import (
    FALLBACK_PREFIX,
    by_group,
    live_partitions,
    merge_snapshots,
    read_snapshot,
    with_group_lag,
)
from consumer.core.tenants import tenant_problem


def _budget_text(tier: dict[str, Any]) -> str:
    """The provider budgets the limiter paces by, when it learnt any."""
    parts = []
    if tier.get("budget_requests_per_s"):
        parts.append(f"{tier['budget_requests_per_s']:g} req/s")
    if tier.get("budget_tokens_per_s"):
        parts.append(f"{tier['budget_tokens_per_s']:g} tokens/s")
    return f" paced at {' and '.join(parts)}" if parts else ""


def _circuit_text(tier: dict[str, Any]) -> str:
    """Whether the tier's provider answers: the circuit's state, and its outages so far with
    the requests they held (a count since start, not requests held now)."""
    opened, held = tier.get("circuit_opened", 0), tier.get("held_requests", 0)
    held_text = f", held {held} request{'s' if held != 1 else ''} while open" if held else ""
    history = f" (opened {opened}x{held_text})" if opened else ""
    if tier.get("circuit_open"):
        return f"OPEN for {tier.get('outage_s', 0):g} s: provider unreachable, jobs held" + history
    return "closed" + history


def _cost_text(t: dict[str, Any]) -> str:
    """A tier's tokens, cost, dedupe and what batching saved (measured, or an estimate)."""
    text = (
        f"in={int(t.get('input_tokens', 0))} out={int(t.get('output_tokens', 0))} "
        f"cached_in={int(t.get('cached_input_tokens', 0))} cache_write={int(t.get('cache_write_tokens', 0))} "
        f"cost=${float(t.get('cost_usd', 0.0)):.4f} deduped={int(t.get('deduped', 0))}"
    )
    saving = BatchSaving.from_counts(
        verify_batched_tokens=int(t.get("verify_batched_tokens", 0)),
        verify_alone_tokens=int(t.get("verify_alone_tokens", 0)),
        batched_tokens=int(t.get("batched_tokens", 0)),
        alone_tokens_estimate=int(t.get("alone_tokens_estimate", 0)),
    )
    fraction = saving.saved_fraction
    if fraction is not None:
        how = "measured on verified jobs" if saving.measured else "estimate from prompt lengths"
        counts = f"({saving.batched} batched vs {saving.alone} alone, {how})"
        if fraction >= 0:
            text += f"; batching saved {fraction:.0%} of tokens {counts}"
        else:  # a saving below zero reads as a cost
            text += f"; batching cost {-fraction:.0%} more tokens than asking alone {counts}"
    return text


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


def format_lag(merged: dict[str, Any]) -> str:
    """The group's lag, and the age of its oldest uncommitted record while there is one."""
    records = merged.get("lag_records", 0)
    text = f"lag: {records} records over {merged.get('lag_partitions', 0)} partitions"
    if not records:  # nothing uncommitted: no record has an age
        return text
    age_s = merged.get("oldest_uncommitted_age_s", 0.0)
    if age_s is None:
        unread = merged.get("lag_partitions_unread", 0)
        return text + f" ({unread} of them read by no live instance: the oldest record's age is unknown)"
    return text + f", oldest uncommitted {age_s:.1f} s"


def format_lanes(merged: dict[str, Any]) -> list[str]:
    """`promptbus stats` lines of the merged snapshot's lanes, one per lane."""
    return [
        f"lane {name}: results={ls.get('results', 0)} dead_letters={ls.get('dead_letters', 0)} "
        f"latency_mean={ls.get('latency_s_mean', 0.0):.3f}s latency_max={ls.get('latency_s_max', 0.0):.3f}s "
        f"in_flight={ls.get('inflight', 0)} paused={ls.get('paused', 0)}"
        for name, ls in sorted(merged.get("lanes", {}).items())
    ]


def _limit_reason_text(merged: dict[str, Any]) -> str:
    """Why the limit is where it is, as the live instances say (`consumer.core.limit.LimitReason`):
    ` (paced)`, or ` (paced: 2 instances, growing: 1)` when they differ; "" when none says."""
    reasons: dict[str, int] = merged.get("limit_reasons") or {}
    if not reasons:
        return ""
    if len(reasons) == 1:
        return f" ({next(iter(reasons))})"
    ranked = sorted(reasons.items(), key=lambda item: (-item[1], item[0]))
    parts = [f"{reason}: {n} instance{'s' if n != 1 else ''}" for reason, n in ranked]
    return f" ({', '.join(parts)})"


def deployment_lines(tier: str, deployments: dict[str, dict[str, Any]]) -> list[str]:
    """`promptbus stats` lines of a tier's deployments (`TIER/NAME` in the merged snapshot),
    one per deployment; none for a tier without `deployments`."""
    lines = []
    prefix = f"{tier}/"
    for key, d in sorted(deployments.items()):
        if not key.startswith(prefix):
            continue
        circuit = "OPEN" if d.get("circuit_open") else "closed"
        if d.get("circuit_opened"):
            circuit += f" (opened {d['circuit_opened']}x)"
        lines.append(
            f"tier {tier} deployment {key.removeprefix(prefix)}: requests={d.get('provider_requests', 0)} "
            f"429s={d.get('rate_limited', 0)} errors={d.get('provider_errors', 0)} limit={d.get('limit', 0)}"
            f"{_limit_reason_text(d)} inflight={d.get('inflight', 0)} tokens={d.get('input_tokens', 0)} in, "
            f"{d.get('output_tokens', 0)} out; circuit {circuit}" + _budget_text(d)
        )
    return lines
def _budget_left(t: dict[str, Any]) -> str:
    """What a tenant's daily budgets have left (none: unlimited)."""
    parts = []
    budget_usd, budget_tokens = float(t.get("budget_usd", 0.0)), int(t.get("budget_tokens", 0))
    if budget_usd:
        left = max(budget_usd - float(t.get("spent_usd", 0.0)), 0.0)
        parts.append(f"${left:.4f} of ${budget_usd:g}")
    if budget_tokens:
        left_tokens = max(budget_tokens - int(t.get("spent_tokens", 0)), 0)
        parts.append(f"{left_tokens} of {budget_tokens} tokens")
    return " budget left today: " + " and ".join(parts) if parts else " budget: unlimited"


def format_tenants(merged: dict[str, Any], only: str | None = None) -> list[str]:
    """`promptbus stats` lines of the merged snapshot's tenant accounts (named tenants,
    `default`, `other`), one per account (`only`: that one's)."""
    return [
        f"tenant {name}: results={int(t.get('results', 0))} dead_letters={int(t.get('dead_letters', 0))}"
        + (f" (tenant_mismatch={int(t['mismatched'])})" if t.get("mismatched") else "")
        + " "
        f"tokens in={int(t.get('input_tokens', 0))} out={int(t.get('output_tokens', 0))} "
        f"cost=${float(t.get('cost_usd', 0.0)):.4f} held={int(t.get('held', 0))}" + _budget_left(t)
        for name, t in sorted(merged.get("tenants", {}).items())
        if only is None or name == only
    ]


def routing_lines(name: str, tier: dict[str, Any]) -> list[str]:
    """`promptbus stats` lines of a merged tier: the jobs it answered for other tiers, and
    its `mode: auto` jobs' split and what offline saved (none when there is nothing to say)."""
    lines = []
    answered_for = {
        k.removeprefix(FALLBACK_PREFIX): v for k, v in tier.items() if k.startswith(FALLBACK_PREFIX)
    }
    if answered_for:
        parts = ", ".join(f"{n} for {source}" for source, n in sorted(answered_for.items()))
        lines.append(f"tier {name} fallback: answered {parts}")
    online, offline = int(tier.get("auto_online", 0)), int(tier.get("auto_offline", 0))
    if online or offline:
        saved = float(tier.get("offline_saved_usd", 0.0))
        lines.append(f"tier {name} mode auto: {offline} offline, {online} online; offline saved ${saved:.4f}")
    return lines


def format_quotas(merged: dict[str, Any]) -> list[str]:
    """`promptbus stats` lines of the fleet quotas: each quota's figures and how much of it the
    live instances hold, then its split, one instance per line (largest share first)."""
    lines = []
    for name, q in sorted(merged.get("quotas", {}).items()):
        figures = ", ".join(f"{v:g} {k}/min" for k, v in sorted(q.get("figures_per_minute", {}).items()))
        instances = q.get("instances", {})
        lines.append(
            f"quota {name}: {figures or 'no figures'}; {len(instances)} live instances hold "
            f"{float(q.get('fraction', 0.0)):.1%} of it, demand {q.get('demand', 0)}, "
            f"{float(q.get('reserved_tokens', 0.0)):.0f} tokens reserved"
        )
        for instance, share in sorted(instances.items(), key=lambda kv: (-kv[1]["fraction"], kv[0])):
            per_minute = ", ".join(f"{v:g} {k}" for k, v in sorted(share.get("share_per_minute", {}).items()))
            lines.append(
                f"quota {name} share of {instance}: {share['fraction']:.1%} ({per_minute} per minute), "
                f"demand {share['demand']}"
            )
    return lines


def format_sources(merged: dict[str, Any]) -> list[str]:
    """`promptbus stats` lines of the sources (`sources:` of the tier file), one per source."""
    lines = []
    for name, s in sorted(merged.get("sources", {}).items()):
        dead = s.get("dead_letters") or {}
        dead_text = " ".join(f"{kind}={n}" for kind, n in sorted(dead.items())) or "0"
        held = f" held={s['held']} (waiting for the registry)" if s.get("held") else ""
        lines.append(
            f"source {name}: in={s.get('records_in', 0)} enriched={s.get('enriched', 0)} "
            f"skipped_unchanged={s.get('skipped_unchanged', 0)} tombstones={s.get('tombstones', 0)} "
            f"stale_dropped={s.get('stale_dropped', 0)} dead_letters: {dead_text}{held}"
        )
    return lines


def format_stats(merged: dict[str, Any]) -> str:
    """The text `promptbus stats` prints for one group's merged snapshots."""
    lines = [f"group {merged['group']}:"] if "group" in merged else []
    lines += [
        f"instances: {merged['instances_live']} live, {merged['instances_seen']} seen",
        f"items in: {merged['items_in']}   results: {merged['results']}   in flight: {merged['inflight']}",
        "dead letters: "
        + (", ".join(f"{k}={v}" for k, v in sorted(merged["dead_letters"].items())) or "none"),
        format_lag(merged),
    ]
    for kind, what, key in (
        ("tier", "job latency", "job_latency"),
        ("tier", "offline job latency", "offline_job_latency"),
        ("lane", "job latency", "lane_job_latency"),
    ):
        for name, p in sorted(merged.get(key, {}).items()):
            if not p["jobs"]:
                continue
            lines.append(
                f"{kind} {name} {what} (live instances, {p['jobs']} jobs): "
                + " ".join(f"{q}={_seconds(p[f'{q}_s'])}" for q in ("p50", "p95", "p99"))
            )
    for name, t in sorted(merged["tiers"].items()):
        lines.append(
            f"tier {name}: requests={t.get('provider_requests', 0)} batched={t.get('batched_requests', 0)} "
            f"saved={t.get('requests_saved', 0)} reasks={t.get('reasks', 0)} splits={t.get('splits', 0)} "
            f"retries={t.get('retries', 0)} 429s={t.get('rate_limited', 0)} limit={t.get('limit', 0)}"
            f"{_limit_reason_text(t)} batch_size={t.get('batch_size', 0)}" + _budget_text(t)
        )
        if t.get("batch_size_reason"):
            # the adaptive rule's own words: the size in use and the evidence for it
            lines.append(f"tier {name} batch {t['batch_size_reason']}")
        lines.append(f"tier {name} circuit: " + _circuit_text(t))
        if t.get("tls_unverified"):
            lines.append(f"tier {name} WARNING: tls.verify is false: provider certificates are not checked")
        lines.append(f"tier {name} tokens: " + _cost_text(t))
        lines.extend(deployment_lines(name, merged.get("deployments", {})))
        lines.extend(routing_lines(name, t))
    lines.extend(format_lanes(merged))
    lines.extend(format_tenants(merged))
    lines.extend(format_sources(merged))
    lines.extend(format_quotas(merged))
    for name, per_size in sorted(merged.get("agreement", {}).items()):
        parts = [
            f"size {size}: {c['agreed']}/{c['compared']}"
            for size, c in sorted(per_size.items(), key=lambda kv: int(kv[0]))
        ]
        lines.append(f"tier {name} agreement (batched vs alone): " + ", ".join(parts))
    return "\n".join(lines)


#: how a section names snapshots whose instance did not record its group (older versions)
UNRECORDED_GROUP = "(not recorded)"


def cmd_stats(args: argparse.Namespace) -> int:
    """The merged snapshots of one consumer group (PROMPTBUS_GROUP_ID or --group), or of every
    group on the cluster with --all-groups, one section per group."""
    from consumer.kafka.clients import group_lag, read_latest

    configure_logging("WARNING", kafka_level="CRITICAL")
    if args.tenant is not None and (problem := tenant_problem(args.tenant)) is not None:
        raise UsageError("--tenant", f"{args.tenant!r} is not a tenant name: it {problem}")
    settings = kafka_settings(args)
    snapshots = []
    for key, value in asyncio.run(read_latest(settings, settings.stats_topic)).items():
        try:
            snapshots.append(read_snapshot(value))
        except ValueError as exc:  # the topic may hold what another tool wrote
            print(f"promptbus stats: skipped record {key!r}, not a stats snapshot: {exc}", file=sys.stderr)
    groups = by_group(snapshots)
    wanted = list(groups) if args.all_groups else [args.group or settings.group_id]
    now_s, live_within_s = time.time(), 3 * settings.stats_interval_s + 5
    sections = {}
    for group in wanted:
        snaps = groups.get(group, [])
        merged = merge_snapshots(snaps, now_s=now_s, live_within_s=live_within_s)
        if group:
            # the group's lag is the broker's: committed offsets against log ends, whether or
            # not an instance runs (an instance's own figure is as old as its last refresh),
            # over the topics the group reads: those it committed on and its live instances read
            live = live_partitions(snaps, now_s=now_s, live_within_s=live_within_s)
            lag = asyncio.run(group_lag(settings, group, sorted({topic for topic, _ in live})))
            if args.group and not snaps and not lag.committed:  # a group named, maybe misspelt
                seen = ", ".join(sorted(g for g in groups if g)) or "none"
                print(
                    f"promptbus stats: no instance of group {group!r} was seen and it committed no "
                    f"offsets (groups seen: {seen})",
                    file=sys.stderr,
                )
                return 1
            unread = sum(1 for tp, n in lag.per_partition.items() if n and tp not in live)
            merged = with_group_lag(
                merged, records=lag.records, partitions=len(lag.per_partition), unread=unread
            )
        sections[group] = {"group": group or UNRECORDED_GROUP, **merged}
    if args.tenant is not None:
        return _print_tenant(args, sections)
    if args.json:
        shown: Any = {"groups": list(sections.values())} if args.all_groups else sections[wanted[0]]
        print(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode())
    elif not sections:
        print("no promptbus instance has published stats on this cluster")
    else:
        print("\n\n".join(format_stats(merged) for merged in sections.values()))
    return 0


def _print_tenant(args: argparse.Namespace, sections: dict[str, dict[str, Any]]) -> int:
    """`stats --tenant NAME`: that tenant account's line (or JSON) per group; exit 1 when no
    instance has counted it (an unnamed tenant is counted as `other`)."""
    found = {g: m["tenants"][args.tenant] for g, m in sections.items() if args.tenant in m.get("tenants", {})}
    if not found:
        print(
            f"promptbus stats: no instance has counted tenant {args.tenant!r} (a tenant the tier "
            "file does not name is counted as 'other')",
            file=sys.stderr,
        )
        return 1
    if args.json:
        shown = found if args.all_groups else next(iter(found.values()))
        print(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode())
        return 0
    for group, merged in sections.items():
        if group in found:
            header = [f"group {merged['group']}:"] if args.all_groups else []
            print("\n".join(header + format_tenants(merged, args.tenant)))
    return 0


def add_stats_command(sub: Any) -> None:
    """`stats`."""
    stats = sub.add_parser("stats", help="items, requests, requests saved by batching, 429s, limits")
    stats.add_argument("--json", action="store_true")
    stats.add_argument(
        "--tenant", help="only this tenant's line: a named tenant, default, or other (the rest)"
    )
    which = stats.add_mutually_exclusive_group()
    which.add_argument("--group", help="the consumer group shown (default: PROMPTBUS_GROUP_ID)")
    which.add_argument(
        "--all-groups", action="store_true", help="every group on the cluster, one section each"
    )
    add_bootstrap(stats)
    stats.set_defaults(func=cmd_stats)
