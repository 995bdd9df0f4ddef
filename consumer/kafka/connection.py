"""Common aiokafka client arguments from Settings (bootstrap servers and security)."""

from __future__ import annotations

import ssl
from typing import Any

from consumer.settings import Settings

#: jobs may be large (DESIGN: a 2 MB job must dead-letter cleanly, its bytes kept in base64)
MAX_MESSAGE_BYTES = 10 * 1024 * 1024


def client_kwargs(settings: Settings) -> dict[str, Any]:
    """Keyword arguments shared by every aiokafka client (consumer, producer, admin).

    The SASL password is unwrapped only here, straight into the client: it is never logged.
    """
    sec = settings.kafka
    kwargs: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap_servers,
        "security_protocol": sec.security_protocol,
    }
    if sec.security_protocol in ("SSL", "SASL_SSL"):
        kwargs["ssl_context"] = ssl.create_default_context(cafile=sec.ssl_cafile)
    if sec.security_protocol.startswith("SASL"):
        kwargs["sasl_mechanism"] = sec.sasl_mechanism or "PLAIN"
        kwargs["sasl_plain_username"] = sec.sasl_username
        kwargs["sasl_plain_password"] = sec.sasl_password.get_secret_value() if sec.sasl_password else None
    return kwargs
