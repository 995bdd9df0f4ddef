"""`make demo`: the main job end to end on this machine.

Starts (unless already running) the local Kafka broker and a model server — the real local
model (llama.cpp server with SmolLM2-135M-Instruct) by default, the provider simulator with
DEMO_PROVIDER=simulator — runs `promptbus run`, submits examples/jobs.jsonl with `promptbus
submit`, prints each job id with its answer (and the dead letters), then `promptbus stats`, and
stops everything it started. Exits 0 only when every job has exactly one outcome.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson
import yaml

ROOT = Path(__file__).resolve().parents[1]
KAFKA = ROOT / "deploy" / "kafka-local" / "kafka"
JOBS = ROOT / "examples" / "jobs.jsonl"
TIERS = ROOT / "examples" / "tiers.yaml"
PROMPTBUS = [sys.executable, "-m", "consumer.cli"]
SIM_PORT = int(os.environ.get("DEMO_SIM_PORT", "18080"))
WAIT_S = float(os.environ.get("DEMO_WAIT_S", "600"))


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def main() -> int:
    provider = os.environ.get("DEMO_PROVIDER", "local")
    if provider not in ("local", "simulator"):
        print(f"DEMO_PROVIDER must be 'local' or 'simulator', not {provider!r}", file=sys.stderr)
        return 2
    cleanups: list[tuple[str, object]] = []
    env = dict(os.environ)
    run_id = uuid.uuid4().hex[:6]
    # a fresh set of topics per demo run, so earlier runs never mix into the output
    env.update(
        {
            "PROMPTBUS_GROUP_ID": f"demo-{run_id}",
            "PROMPTBUS_JOBS_TOPIC": f"demo-{run_id}.jobs",
            "PROMPTBUS_RESULTS_TOPIC": f"demo-{run_id}.results",
            "PROMPTBUS_DLQ_TOPIC": f"demo-{run_id}.dlq",
            "PROMPTBUS_BATCHES_TOPIC": f"demo-{run_id}.batches",
            "PROMPTBUS_STATS_TOPIC": f"demo-{run_id}.stats",
            "PROMPTBUS_STATS_INTERVAL_S": "1",
        }
    )
    started = time.monotonic()
    try:
        if not env.get("KAFKA_BOOTSTRAP_SERVERS"):
            step("Kafka: local broker (deploy/kafka-local)")
            was_running = subprocess.run([str(KAFKA), "status"], capture_output=True).returncode == 0
            out = subprocess.run([str(KAFKA), "start"], check=True, capture_output=True, text=True).stdout
            env["KAFKA_BOOTSTRAP_SERVERS"] = out.strip().splitlines()[-1]
            if not was_running:
                cleanups.append(("broker", None))
            print(f"bootstrap {env['KAFKA_BOOTSTRAP_SERVERS']}")

        tiers = yaml.safe_load(TIERS.read_text())
        if provider == "simulator":
            step(f"provider: simulator on 127.0.0.1:{SIM_PORT}")
            sim = subprocess.Popen(
                [*PROMPTBUS, "simulate", "--port", str(SIM_PORT), "--faults", "latency_ms=20,missing=0.2"],
                env=env,
            )
            cleanups.append(("process", sim))
            _wait_http(f"http://127.0.0.1:{SIM_PORT}/_sim/stats")
            tiers["tiers"]["small"]["base_url"] = f"http://127.0.0.1:{SIM_PORT}/v1"
            tiers["tiers"]["small"]["model"] = "sim-model"
        else:
            step("provider: llama.cpp server with SmolLM2-135M-Instruct (promptbus local-model serve)")
            status = subprocess.run([*PROMPTBUS, "local-model", "status"], env=env, capture_output=True)
            if status.returncode != 0:
                subprocess.run([*PROMPTBUS, "local-model", "serve"], env=env, check=True)
                cleanups.append(("local-model", None))
            tiers["tiers"]["small"]["base_url"] = "http://127.0.0.1:8080/v1"

        workdir = Path(tempfile.mkdtemp(prefix="promptbus-demo-"))
        config = workdir / "tiers.yaml"
        config.write_text(yaml.safe_dump(tiers))

        step(f"promptbus run --config {config}")
        log_path = workdir / "service.log"
        service = subprocess.Popen(
            [*PROMPTBUS, "run", "--config", str(config)],
            env=env,
            stdout=log_path.open("wb"),
            stderr=subprocess.STDOUT,
        )
        cleanups.append(("process", service))

        step(f"promptbus submit --file {JOBS.relative_to(ROOT)}")
        subprocess.run([*PROMPTBUS, "submit", "--file", str(JOBS)], env=env, check=True)
        expected = {orjson.loads(line)["id"] for line in JOBS.read_bytes().splitlines() if line.strip()}

        step(f"waiting for {len(expected)} outcomes")
        results, dead = _wait_outcomes(env, expected, service)
        for jid in sorted(results):
            r = results[jid]
            via = f"batch of {r['batch']['size']}" if r["batch"] else "single request"
            print(f"  {jid}  {r['output'].strip()[:60]!r:<40} ({via}, attempts {r['attempts']})")
        for jid in sorted(dead, key=str):
            d = dead[jid]
            print(f"  {jid}  DEAD LETTER {d['error']['kind']}: {d['error']['message'][:70]}")

        step("SIGTERM the service (graceful drain)")
        service.send_signal(signal.SIGTERM)
        code = service.wait(timeout=60)
        print(f"promptbus run exited {code}")
        cleanups.remove(("process", service))

        step("promptbus stats")
        subprocess.run([*PROMPTBUS, "stats"], env=env, check=True)
        missing = expected - set(results) - set(dead)
        print(
            f"\ndemo finished in {time.monotonic() - started:.1f} s: {len(results)} results, "
            f"{len(dead)} dead letters, {len(missing)} missing"
        )
        return 0 if not missing and code == 0 else 1
    finally:
        for kind, thing in reversed(cleanups):
            if kind == "process":
                proc = thing
                assert isinstance(proc, subprocess.Popen)
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
            elif kind == "local-model":
                subprocess.run([*PROMPTBUS, "local-model", "stop"], env=env)
            elif kind == "broker":
                subprocess.run([str(KAFKA), "stop"])


def _wait_http(url: str, timeout_s: float = 30) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s")


def _read(env: dict[str, str], dlq: bool) -> list[dict]:
    args = [*PROMPTBUS, "results", *(["--dlq"] if dlq else [])]
    out = subprocess.run(args, env=env, check=True, capture_output=True).stdout
    return [orjson.loads(line) for line in out.splitlines() if line.strip()]


def _wait_outcomes(env: dict[str, str], expected: set[str], service: subprocess.Popen) -> tuple[dict, dict]:
    started = time.monotonic()
    deadline = started + WAIT_S
    results: dict = {}
    dead: dict = {}
    shown = -1
    while time.monotonic() < deadline:
        results = {r["id"]: r for r in _read(env, dlq=False)}
        dead = {d["id"]: d for d in _read(env, dlq=True)}
        done = expected & (set(results) | set(dead))
        if len(done) != shown:
            shown = len(done)
            print(f"  {shown}/{len(expected)} done after {time.monotonic() - started:.1f} s", flush=True)
        if done == expected:
            return results, dead
        if service.poll() is not None:
            raise RuntimeError(f"promptbus run exited early with {service.returncode}")
        time.sleep(1.0)
    return results, dead


if __name__ == "__main__":
    sys.exit(main())
