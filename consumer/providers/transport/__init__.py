"""The HTTP edge of the provider adapters: `HttpTransport` and its keep-alive implementation."""

from consumer.providers.transport.base import HttpResponse, HttpTarget, HttpTransport, parse_target
from consumer.providers.transport.form import form_body
from consumer.providers.transport.pool import KeepAliveTransport

__all__ = ["HttpResponse", "HttpTarget", "HttpTransport", "KeepAliveTransport", "form_body", "parse_target"]
