"""`make demo`: the main job end to end on this machine.

Starts (unless already running) the local Kafka broker and a model server — the real local
model (llama.cpp server with SmolLM2-135M-Instruct) by default, the provider simulator with
DEMO_PROVIDER=simulator — runs `promptbus run`, submits examples/jobs.jsonl with `promptbus
submit`, prints each job id with its answer (and the dead letters), then `promptbus stats`, and
stops everything it started.

The local model server listens on DEMO_MODEL_PORT (default 8080). It also embeds a few texts
through an embedding tier (`local-model serve --embeddings` on DEMO_EMBED_PORT, default 8081,
or the simulator) and prints each text's vector size and first
values. Exits 0 only when every text has its vector and every job has its result, except
the jobs that name a tier the tier file lacks (there to show a dead letter), which must be
dead-lettered `unknown_tier`. While it
waits it watches the provider; when the provider is gone (crashed, refusing connections), it
says so in one line and stops waiting.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import orjson

from consumer.yaml12 import dump_yaml, load_yaml

ROOT = Path(__file__).resolve().parents[1]
KAFKA = ROOT / "deploy" / "kafka-local" / "kafka"
JOBS = ROOT / "examples" / "jobs.jsonl"
TIERS = ROOT / "examples" / "tiers.yaml"
PROMPTBUS = [sys.executable, "-m", "consumer.cli"]
SIM_PORT = int(os.environ.get("DEMO_SIM_PORT", "18080"))
WAIT_S = float(os.environ.get("DEMO_WAIT_S", "600"))
#: how often the wait looks at the provider (a dead one holds jobs: nothing else would end it)
HEALTH_EVERY_S = 3.0
#: the local model server's port (`local-model serve`)
MODEL_PORT = int(os.environ.get("DEMO_MODEL_PORT", "8080"))
#: the embedding server's port (`local-model serve --embeddings`) and the texts the demo embeds
EMBED_PORT = int(os.environ.get("DEMO_EMBED_PORT", "8081"))
EMBED_TEXTS = ["The cat sat on the mat.", "A kitten rested on the rug.", "Stock markets fell today."]
EMBED_TIER = "embed"


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
            "PROMPTBUS_BATCHING_TOPIC": f"demo-{run_id}.batching",
            "PROMPTBUS_STATS_INTERVAL_S": "1",
            # the demo's jobs take a second or two; held ones (a dead provider) need no long drain
            "PROMPTBUS_SHUTDOWN_TIMEOUT_S": os.environ.get("PROMPTBUS_SHUTDOWN_TIMEOUT_S", "10"),
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

        tiers = load_yaml(TIERS.read_text())
        if provider == "simulator":
            step(f"provider: simulator on 127.0.0.1:{SIM_PORT}")
            sim = subprocess.Popen(
                [*PROMPTBUS, "simulate", "--port", str(SIM_PORT), "--faults", "latency_ms=20,missing=0.2"],
                env=env,
            )
            cleanups.append(("process", sim))
            _wait_http(f"http://127.0.0.1:{SIM_PORT}/_sim/stats")
            print(f"simulator ready: pid {sim.pid}", flush=True)
            base_url = f"http://127.0.0.1:{SIM_PORT}/v1"
            tiers["tiers"]["small"]["base_url"] = base_url
            tiers["tiers"]["small"]["model"] = "sim-model"
            tiers["tiers"][EMBED_TIER] = embed_tier(base_url, "sim-embed")
            health = ProviderHealth(base_url, env, simulator=sim)
        else:
            step("provider: llama.cpp server with SmolLM2-135M-Instruct (promptbus local-model serve)")
            model_port = ["--port", str(MODEL_PORT)]
            status = subprocess.run(
                [*PROMPTBUS, "local-model", "status", *model_port], env=env, capture_output=True
            )
            if status.returncode != 0:
                served = subprocess.run([*PROMPTBUS, "local-model", "serve", *model_port], env=env)
                if served.returncode != 0:
                    print("demo failed: the local model server did not start (above)", flush=True)
                    return 1
                cleanups.append(("local-model", MODEL_PORT))
            base_url = f"http://127.0.0.1:{MODEL_PORT}/v1"
            tiers["tiers"]["small"]["base_url"] = base_url
            health = ProviderHealth(base_url, env, simulator=None, port=MODEL_PORT)
            step(f"provider: the same model, mean-pooled for embeddings (port {EMBED_PORT})")
            port = ["--port", str(EMBED_PORT)]
            status = subprocess.run(
                [*PROMPTBUS, "local-model", "status", *port], env=env, capture_output=True
            )
            if status.returncode != 0:
                served = subprocess.run([*PROMPTBUS, "local-model", "serve", "--embeddings", *port], env=env)
                if served.returncode != 0:
                    print("demo failed: the local embedding server did not start (above)", flush=True)
                    return 1
                cleanups.append(("local-model", EMBED_PORT))
            tiers["tiers"][EMBED_TIER] = embed_tier(f"http://127.0.0.1:{EMBED_PORT}/v1", "smollm2-135m-embed")

        workdir = Path(tempfile.mkdtemp(prefix="promptbus-demo-"))
        config = workdir / "tiers.yaml"
        config.write_text(dump_yaml(tiers))

        step(f"promptbus run --config {config}")
        log_path = workdir / "service.log"
        service = subprocess.Popen(
            [*PROMPTBUS, "run", "--config", str(config)],
            env=env,
            stdout=log_path.open("wb"),
            stderr=subprocess.STDOUT,
        )
        cleanups.append(("process", service))

        jobs = [orjson.loads(line) for line in JOBS.read_bytes().splitlines() if line.strip()]
        # the jobs naming a tier the file lacks are there to show a dead letter
        meant_to_fail = {j["id"] for j in jobs if j["tier"] not in tiers["tiers"]}
        expected = {j["id"] for j in jobs}

        step(f"client: map_jobs({JOBS.relative_to(ROOT)}), {len(jobs)} jobs, outcomes in input order")
        os.environ.update(env)  # the client reads the same PROMPTBUS_* settings as the service
        outcomes, provider_down = asyncio.run(_map_through_client(jobs, service, health))
        results = {j["id"]: o.result for j, o in zip(jobs, outcomes, strict=True) if o.ok}
        dead = {
            j["id"]: {"error": {"kind": o.error.kind, "message": o.error.message}}
            for j, o in zip(jobs, outcomes, strict=True)
            if o.error is not None
        }
        for jid in sorted(results):
            r = results[jid]
            via = f"batch of {r['batch']['size']}" if r["batch"] else "single request"
            print(f"  {jid}  {r['output'].strip()[:60]!r:<40} ({via}, attempts {r['attempts']})")
        _print_dead_letters(dead)

        vectors: list[list[float] | None] = []
        if not provider_down:  # a dead provider would not embed either
            step(f"client: map_embed({EMBED_TIER!r}, {len(EMBED_TEXTS)} texts): one array request")
            vectors = asyncio.run(_embed_through_client())
        for text, vector in zip(EMBED_TEXTS, vectors, strict=False):
            first = [round(x, 4) for x in vector[:3]] if vector is not None else []
            shown = "no vector" if vector is None else f"{len(vector)} floats, first {first}"
            print(f"  {text[:30]!r:<34} {shown}")

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
        problems = _verdict(expected, meant_to_fail, results, dead, code)
        if any(v is None for v in vectors):
            problems.append(f"{sum(v is None for v in vectors)} of {len(vectors)} texts got no embedding")
        if provider_down:
            problems.insert(0, provider_down)
        for problem in problems:
            print(f"demo failed: {problem}", flush=True)
        return 1 if problems else 0
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
                subprocess.run([*PROMPTBUS, "local-model", "stop", "--port", str(thing)], env=env)
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


def embed_tier(base_url: str, model: str) -> dict:
    """The demo's embedding tier: embed jobs windowed into array requests of up to 32."""
    return {
        "provider": "openai_compat",
        "base_url": base_url,
        "model": model,
        "timeout_s": 120,
        "batching": {"enabled": True, "max_items": 32, "window_ms": 100, "max_wait_ms": 1000},
    }


async def _embed_through_client() -> list[list[float] | None]:
    """The demo's texts embedded by the service: each text's vector (None: it got none)."""
    from consumer.client import AsyncClient, MapTimeout

    async with AsyncClient() as client:
        try:
            outcomes = await client.map_embed(EMBED_TIER, EMBED_TEXTS, timeout_s=120)
        except MapTimeout as timeout:
            outcomes = timeout.outcomes
    return [o.result["embedding"] if o.ok and o.result else None for o in outcomes]


async def _map_through_client(
    jobs: list[dict], service: subprocess.Popen, health: ProviderHealth
) -> tuple[list, str | None]:
    """Submit the jobs and wait for their outcomes with the client, looking at the provider
    between waits: (outcomes in the jobs' order, why the provider is gone or None)."""
    from consumer.client import AsyncClient, MapTimeout, Progress

    started = time.monotonic()
    shown = [-1]
    # aiokafka retries what a just-created topic's metadata lacks and logs each retry
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)

    def progress(p: Progress) -> None:
        # each wait is a new call with its own clock: the demo's counts from its first
        if p.done != shown[0]:
            shown[0] = p.done
            elapsed_s = time.monotonic() - started
            print(f"  {p.done}/{p.total} done after {elapsed_s:.1f} s ({p.failed} failed)", flush=True)

    async with AsyncClient() as client:
        try:
            return await client.map_jobs(jobs, on_progress=progress, timeout_s=HEALTH_EVERY_S), None
        except MapTimeout as timeout:
            run_id, outcomes = timeout.run_id, timeout.outcomes
        while time.monotonic() - started < WAIT_S:
            if service.poll() is not None:
                raise RuntimeError(f"promptbus run exited early with {service.returncode}")
            down = await asyncio.to_thread(health.down)
            if down is not None:
                return outcomes, down
            try:
                return await client.collect(
                    run_id, len(jobs), on_progress=progress, timeout_s=HEALTH_EVERY_S
                ), None
            except MapTimeout as timeout:
                outcomes = timeout.outcomes
    return outcomes, None


class ProviderHealth:
    """Tells, in one line, why the demo's provider cannot answer, or None while it can."""

    def __init__(
        self, base_url: str, env: dict[str, str], *, simulator: subprocess.Popen | None, port: int = 0
    ) -> None:
        self.base_url = base_url
        self._env = env
        self._simulator = simulator
        #: the local model server's port (without a simulator)
        self._port = port

    def down(self) -> str | None:
        import httpx

        if self._simulator is not None and self._simulator.poll() is not None:
            return f"the provider simulator at {self.base_url} exited ({_how(self._simulator.returncode)})"
        if self._simulator is None:
            status = [*PROMPTBUS, "local-model", "status", "--port", str(self._port)]
            out = subprocess.run(status, env=self._env, capture_output=True)
            if out.returncode != 0 and out.stdout.strip():
                state = orjson.loads(out.stdout.splitlines()[-1])
                if state.get("crashed"):
                    return (
                        f"the model server at {self.base_url} crashed ({state.get('exit')}); "
                        f"its log: {state.get('log_path')}"
                    )
        try:
            httpx.get(f"{self.base_url}/models", timeout=5)
        except httpx.ConnectError:
            return f"the model server at {self.base_url} refused connections"
        except httpx.HTTPError as exc:
            return f"the model server at {self.base_url} did not answer ({type(exc).__name__})"
        return None


def _how(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        return f"signal {signal.Signals(-returncode).name}"
    return f"exit code {returncode}"


def _print_dead_letters(dead: dict) -> None:
    """One line per dead letter, but one line per reason when many share it (an outage)."""
    by_reason: dict[tuple[str, str], list[str]] = {}
    for jid in sorted(dead, key=str):
        error = dead[jid]["error"]
        # addresses, ports and counts vary per job; the reason is what is left
        reason = re.sub(r"\d+", "N", error["message"])[:90]
        by_reason.setdefault((error["kind"], reason), []).append(str(jid))
    for (kind, _), ids in by_reason.items():
        if len(ids) > 2:
            message = dead[ids[0]]["error"]["message"][:90]
            print(f"  {len(ids)} jobs ({ids[0]} .. {ids[-1]})  DEAD LETTER {kind}: {message}")
            continue
        for jid in ids:
            print(f"  {jid}  DEAD LETTER {kind}: {dead[jid]['error']['message'][:70]}")


def _verdict(
    expected: set[str], meant_to_fail: set[str], results: dict, dead: dict, service_code: int
) -> list[str]:
    """What makes this run a failure (nothing: it succeeded)."""
    problems = []
    no_result = sorted(expected - meant_to_fail - set(results))
    if no_result:
        problems.append(f"{len(no_result)} of {len(expected - meant_to_fail)} jobs got no result")
    wrong = sorted(j for j in meant_to_fail if dead.get(j, {}).get("error", {}).get("kind") != "unknown_tier")
    if wrong:
        problems.append(f"{', '.join(wrong)} should have been dead-lettered unknown_tier")
    if service_code != 0:
        problems.append(f"promptbus run exited {service_code} on SIGTERM")
    return problems


if __name__ == "__main__":
    sys.exit(main())
