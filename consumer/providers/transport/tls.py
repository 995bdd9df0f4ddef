"""The TLS context of a deployment's connections, built once with its transport.

The system's CA certificates are trusted as `ssl.create_default_context` finds them (so
`SSL_CERT_FILE` and `SSL_CERT_DIR` keep working); `ca_file` adds a company CA to them, or
replaces them (`system_ca: false`); a client certificate and key answer gateways that ask for
one (mTLS); `verify: false` checks nothing (the factory warns at start).

`describe_tls_error` turns a failed handshake into one line: the reason, never a key.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """What a deployment's TLS trusts and presents (the tier file's `tls:`).

    ca_file: PEM CA bundle trusted beside the system's (or instead: system_ca False);
    client_cert_file / client_key_file: PEM client certificate and its key (the key may be in
    the certificate's file); verify: False trusts any certificate and host name.
    """

    ca_file: str | None = None
    system_ca: bool = True
    client_cert_file: str | None = None
    client_key_file: str | None = None
    verify: bool = True


def ssl_context(options: TlsOptions | None) -> ssl.SSLContext:
    """A client context for `options` (None: the system's defaults). OSError or ssl.SSLError
    when a file is missing or not PEM."""
    if options is None:
        return ssl.create_default_context()
    if options.system_ca:
        context = ssl.create_default_context()
        if options.ca_file:
            context.load_verify_locations(cafile=options.ca_file)
    else:
        context = ssl.create_default_context(cafile=options.ca_file)
    if options.client_cert_file:
        context.load_cert_chain(options.client_cert_file, options.client_key_file)
    if not options.verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def describe_tls_error(exc: BaseException, host: str, port: int) -> str:
    """One line on why TLS to host:port failed (verification's own reason when it has one)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = exc.verify_message or exc.reason or "certificate verify failed"
        return f"TLS to {host}:{port}: the certificate failed verification: {reason}"
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or type(exc).__name__
        return f"TLS to {host}:{port} failed: {reason}"
    return f"TLS to {host}:{port} failed: {exc}"
