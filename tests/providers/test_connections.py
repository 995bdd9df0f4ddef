"""Provider connections the way a company's network makes them: through a real HTTP proxy
(tinyproxy, with and without basic auth, `NO_PROXY`), to the simulator serving HTTPS with a
private CA made here (with and without a required client certificate), promptbus's adapters
and the official openai SDK side by side.

Every proxy is a real tinyproxy process and every TLS server the real simulator (uvicorn with
the certificates below); what the proxy saw is read from its own log. The proxy's settings are
read when the transport is built, so each case sets the environment before it builds.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from consumer.core.circuit import is_outage
from consumer.core.completion import ChatMessage, CompletionRequest
from consumer.core.errors import ConnectionFailed, ProviderError
from consumer.providers.factory import build_provider, make_http_client
from consumer.runtime import eventloop
from consumer.runtime.reachability import check_tier_providers
from consumer.settings import TierConfig
from consumer.testing.certs import CertPair, PrivateCA
from consumer.testing.ports import free_port
from consumer.testing.simulator import SimulatorServer, SimulatorTls, answer_for
from consumer.testing.tinyproxy import TinyProxy, run_tinyproxy

LOOPS = ["asyncio", "uvloop"]
PROXY_VARIABLES = (
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "NO_PROXY",
    "https_proxy",
    "http_proxy",
    "no_proxy",
    "ALL_PROXY",
)
USER, PASSWORD = "pbuser", "pb-proxy-secret-7f3a"
#: what proxy and TLS errors must name
WHO = "tier t deployment d"


@dataclass(frozen=True)
class Pki:
    """The test's private CA, the simulator's certificates and a client certificate."""

    ca: PrivateCA
    server: CertPair
    wrong_host: CertPair
    client: CertPair
    stranger_client: CertPair  # signed by another CA the server does not trust


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    ca = PrivateCA(tmp_path_factory.mktemp("pki"), "corp")
    other = PrivateCA(tmp_path_factory.mktemp("pki-other"), "other")
    return Pki(
        ca,
        ca.issue("sim", hosts=("127.0.0.1", "localhost")),
        ca.issue("elsewhere", hosts=("elsewhere.test",)),
        ca.issue("pb-client", client=True),
        other.issue("stranger", client=True),
    )


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyProxy]:
    with run_tinyproxy(tmp_path_factory.mktemp("proxy")) as running:
        yield running


@pytest.fixture(scope="module")
def auth_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyProxy]:
    with run_tinyproxy(tmp_path_factory.mktemp("auth-proxy"), basic_auth=(USER, PASSWORD)) as running:
        yield running


@pytest.fixture(autouse=True)
def no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each case starts from an environment without proxy variables (it sets its own)."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def tier(base_url: str, **keys: Any) -> TierConfig:
    return TierConfig.model_validate(
        {"provider": "openai", "model": "sim-model", "base_url": base_url + "/v1", "timeout_s": 5, **keys}
    )


def request(text: str) -> CompletionRequest:
    return CompletionRequest((ChatMessage("user", f"Answer this:\n{text}"),), "sim-model", {"max_tokens": 20})


async def ask(config: TierConfig, texts: list[str]) -> list[str]:
    """Each text asked at once through a provider built the way the service builds one."""
    client = make_http_client(config, "t.deployments.0", name=WHO)
    provider = build_provider("t.deployments.0", config, client)
    try:
        answers = await asyncio.gather(*(provider.complete(request(t)) for t in texts))
    finally:
        await provider.aclose()
        await client.close()
    return [a.text for a in answers]


async def failure(config: TierConfig) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        await ask(config, ["one"])
    return info.value


def tls_server(pki: Pki, *, pair: CertPair | None = None, mtls: bool = False) -> SimulatorServer:
    pair = pair or pki.server
    client_ca = str(pki.ca.ca_file) if mtls else None
    return SimulatorServer(tls=SimulatorTls(str(pair.cert_file), str(pair.key_file), client_ca))


def port_of(base_url: str) -> int:
    return int(base_url.rsplit(":", 1)[1])


def run(loop: str, case: Callable[[], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        return await case()

    return eventloop.run(main(), loop)  # type: ignore[arg-type]


# ---------------------------------------------------------------- through the proxy


@pytest.mark.parametrize("loop", LOOPS)
def test_https_through_the_proxy_is_a_tunnel_and_every_request_is_answered(
    loop: str, pki: Pki, proxy: TinyProxy
) -> None:
    texts = [f"job {i}" for i in range(60)]

    async def case() -> tuple[list[str], int, int]:
        async with tls_server(pki) as base_url:
            config = tier(base_url, proxy=proxy.url, tls={"ca_file": str(pki.ca.ca_file)})
            answers = await ask(config, texts)
            return answers, proxy.tunnels_to(port_of(base_url)), port_of(base_url)

    answers, tunnels, port = run(loop, case)
    assert answers == [answer_for(t) for t in texts]
    # keep-alive through the tunnel: at most one tunnel per pooled connection, not per request
    assert 1 <= tunnels <= 64 + 4 < len(texts) * 2
    assert all(line.startswith("CONNECT ") for line in proxy.requests_to(port)), "HTTPS never in clear"


async def test_the_pool_keeps_a_tunnel_across_requests(pki: Pki, proxy: TinyProxy) -> None:
    async with tls_server(pki) as base_url:
        config = tier(base_url, proxy=proxy.url, tls={"ca_file": str(pki.ca.ca_file)})
        client = make_http_client(config, "t", name=WHO)
        provider = build_provider("t", config, client)
        for i in range(5):  # one after the other: one connection, one tunnel
            assert (await provider.complete(request(f"x{i}"))).text == answer_for(f"x{i}")
        await provider.aclose()
        assert proxy.tunnels_to(port_of(base_url)) == 1


async def test_basic_auth_proxy_with_and_without_credentials(pki: Pki, auth_proxy: TinyProxy) -> None:
    async with tls_server(pki) as base_url:
        tls = {"ca_file": str(pki.ca.ca_file)}
        good = tier(base_url, proxy=auth_proxy.url_with(USER, PASSWORD), tls=tls)
        assert await ask(good, ["a", "b"]) == [answer_for("a"), answer_for("b")]

        missing = await failure(tier(base_url, proxy=auth_proxy.url, tls=tls))
        wrong = await failure(tier(base_url, proxy=auth_proxy.url_with(USER, "not-" + PASSWORD), tls=tls))
    for error in (missing, wrong):
        assert isinstance(error, ConnectionFailed) and is_outage(error), (
            "held as an outage, not dead-lettered"
        )
        assert WHO in error.message and auth_proxy.url in error.message, error.message
        assert "\n" not in error.message
        assert PASSWORD not in error.message and USER not in error.message
    assert "407" in missing.message
    assert "401" in wrong.message or "407" in wrong.message  # tinyproxy answers a wrong password 401


async def test_plain_http_goes_to_the_proxy_as_absolute_form_requests(auth_proxy: TinyProxy) -> None:
    async with SimulatorServer() as base_url:
        port = port_of(base_url)
        config = tier(base_url, proxy=auth_proxy.url_with(USER, PASSWORD))
        assert await ask(config, ["plain"]) == [answer_for("plain")]
        assert f"POST http://127.0.0.1:{port}/v1/chat/completions HTTP/1.1" in auth_proxy.requests_to(port)

        refused = await failure(tier(base_url, proxy=auth_proxy.url))
    assert isinstance(refused, ConnectionFailed) and "407" in refused.message and WHO in refused.message


async def test_proxy_variables_are_honoured_and_no_proxy_bypasses(
    pki: Pki, proxy: TinyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with tls_server(pki) as base_url:
        port = port_of(base_url)
        config = tier(base_url, tls={"ca_file": str(pki.ca.ca_file)})
        monkeypatch.setenv("https_proxy", proxy.url)  # lower case, as getproxies reads it too
        assert await ask(config, ["via env"]) == [answer_for("via env")]
        through = proxy.tunnels_to(port)
        assert through >= 1

        monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
        assert await ask(config, ["bypass"]) == [answer_for("bypass")]
        assert proxy.tunnels_to(port) == through, "NO_PROXY: straight to the provider"

        monkeypatch.setenv("NO_PROXY", f"elsewhere.test,127.0.0.1:{port + 1}")
        assert await ask(config, ["not bypassed"]) == [answer_for("not bypassed")]
        assert proxy.tunnels_to(port) == through + 1


async def test_the_tiers_proxy_wins_over_the_variables(
    pki: Pki, proxy: TinyProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("HTTPS_PROXY", dead)
    async with tls_server(pki) as base_url:
        port = port_of(base_url)
        tls = {"ca_file": str(pki.ca.ca_file)}
        assert isinstance(await failure(tier(base_url, tls=tls)), ConnectionFailed), "the variable is read"
        assert await ask(tier(base_url, tls=tls, proxy="none"), ["direct"]) == [answer_for("direct")]
        before = proxy.tunnels_to(port)
        assert await ask(tier(base_url, tls=tls, proxy=proxy.url), ["named"]) == [answer_for("named")]
        assert proxy.tunnels_to(port) == before + 1


def test_a_deployments_proxy_and_tls_win_over_the_tiers() -> None:
    config = TierConfig.model_validate(
        {
            "provider": "openai",
            "model": "m",
            "proxy": "none",
            "tls": {"verify": True},
            "deployments": [
                {"name": "eu", "proxy": "http://u:p@proxy.corp:3128", "tls": {"ca_file": "/corp/ca.pem"}},
                {"name": "us"},
            ],
        }
    )
    (_, _, _, eu), (_, _, _, us) = config.deployment_configs("t")
    assert (
        eu.proxy == "http://u:p@proxy.corp:3128" and eu.tls is not None and eu.tls.ca_file == "/corp/ca.pem"
    )
    assert us.proxy == "none" and us.tls is not None and us.tls.ca_file is None


def test_a_bad_proxy_url_is_refused_at_load_without_repeating_it() -> None:
    from consumer.core.errors import ConfigError
    from consumer.settings import parse_tier_file

    with pytest.raises(ConfigError) as info:
        parse_tier_file(
            {"tiers": {"t": {"provider": "openai", "model": "m", "proxy": f"socks5://u:{PASSWORD}@h:1080"}}}
        )
    assert "tiers.t.proxy" in str(info.value) and PASSWORD not in str(info.value)


async def test_the_reachability_check_says_the_refusal_in_one_line(pki: Pki, auth_proxy: TinyProxy) -> None:
    async with tls_server(pki) as base_url:
        config = tier(base_url, proxy=auth_proxy.url, tls={"ca_file": str(pki.ca.ca_file)})
        client = make_http_client(config, "t.deployments.0", name=WHO)
        provider = build_provider("t.deployments.0", config, client)
        outcome = await check_tier_providers({"t": provider}, {"t": base_url})
        await provider.aclose()
    reason = outcome["t"]
    assert reason is not None and "\n" not in reason
    assert WHO in reason and "407" in reason and PASSWORD not in reason


# ---------------------------------------------------------------- TLS


async def test_a_required_client_certificate(pki: Pki, proxy: TinyProxy) -> None:
    ca = str(pki.ca.ca_file)
    async with tls_server(pki, mtls=True) as base_url:
        mine = {
            "ca_file": ca,
            "client_cert_file": str(pki.client.cert_file),
            "client_key_file": str(pki.client.key_file),
        }
        assert await ask(tier(base_url, tls=mine), ["mtls"]) == [answer_for("mtls")]
        assert await ask(tier(base_url, tls=mine, proxy=proxy.url), ["mtls+proxy"]) == [
            answer_for("mtls+proxy")
        ]

        none = await failure(tier(base_url, tls={"ca_file": ca}))
        stranger = {
            "ca_file": ca,
            "client_cert_file": str(pki.stranger_client.cert_file),
            "client_key_file": str(pki.stranger_client.key_file),
        }
        refused = await failure(tier(base_url, tls=stranger))
    for error in (none, refused):
        assert isinstance(error, ConnectionFailed) and "\n" not in error.message, error.message


async def test_a_certificate_that_fails_verification_is_one_line_naming_the_deployment(pki: Pki) -> None:
    async with tls_server(pki) as base_url:
        unknown_ca = await failure(tier(base_url))  # the system CAs do not know the test's CA
    async with tls_server(pki, pair=pki.wrong_host) as base_url:
        wrong_host = await failure(tier(base_url, tls={"ca_file": str(pki.ca.ca_file)}))
    for error in (unknown_ca, wrong_host):
        assert isinstance(error, ConnectionFailed), error
        assert WHO in error.message and "failed verification" in error.message and "\n" not in error.message
    assert "local issuer" in unknown_ca.message
    assert "mismatch" in wrong_host.message.lower() or "hostname" in wrong_host.message.lower()


async def test_ca_only_and_ssl_cert_file(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    async with tls_server(pki) as base_url:
        only = tier(base_url, tls={"ca_file": str(pki.ca.ca_file), "system_ca": False})
        assert await ask(only, ["only"]) == [answer_for("only")]
        monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca.ca_file))
        assert await ask(tier(base_url), ["env"]) == [answer_for("env")]


async def test_verify_false_connects_and_warns_at_start(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    async with tls_server(pki, pair=pki.wrong_host) as base_url:
        assert await ask(tier(base_url, tls={"verify": False}), ["trusting"]) == [answer_for("trusting")]
    assert any("verify is false" in r.getMessage() for r in caplog.records)


def test_tls_files_that_do_not_load_are_a_config_error(tmp_path: Path) -> None:
    from consumer.core.errors import ConfigError

    with pytest.raises(ConfigError, match=r"tiers\.t\.tls"):
        make_http_client(tier("https://x", tls={"ca_file": str(tmp_path / "missing.pem")}), "t")


# ---------------------------------------------------------------- the official SDK beside promptbus


async def test_the_openai_sdk_and_promptbus_through_the_same_proxy_to_the_same_tls_simulator(
    pki: Pki, auth_proxy: TinyProxy
) -> None:
    proxy_url = auth_proxy.url_with(USER, PASSWORD)
    texts = [f"sdk {i}" for i in range(10)]
    async with tls_server(pki) as base_url:
        port = port_of(base_url)
        context = ssl.create_default_context(cafile=str(pki.ca.ca_file))
        async with httpx.AsyncClient(proxy=proxy_url, verify=context) as http:
            sdk = openai.AsyncOpenAI(
                base_url=base_url + "/v1", api_key="unused", http_client=http, max_retries=0
            )
            replies = await asyncio.gather(
                *(
                    sdk.chat.completions.create(
                        model="sim-model", messages=[{"role": "user", "content": f"Answer this:\n{t}"}]
                    )
                    for t in texts
                )
            )
        sdk_tunnels = auth_proxy.tunnels_to(port)
        ours = await ask(tier(base_url, proxy=proxy_url, tls={"ca_file": str(pki.ca.ca_file)}), texts)
    assert [r.choices[0].message.content for r in replies] == ours == [answer_for(t) for t in texts]
    assert sdk_tunnels >= 1 and auth_proxy.tunnels_to(port) > sdk_tunnels
