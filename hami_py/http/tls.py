"""TLS for the extender and webhook server, with certificates rotated on disk picked up live.

Serving certificates are short-lived where cert-manager or a Secret rotation renews them, and
the kube-apiserver refuses a webhook whose certificate expired: a restart to pick up the new
pair would be an outage with failurePolicy Fail, or silently unmutated GPU pods with Ignore.
So the pair is checked (two ``stat`` calls, at most once per ``check_interval_s``) when a new
connection's handshake starts, and a changed pair is loaded into a fresh SSLContext that the
handshake switches to. A pair that does not load (mid-rotation, key and certificate not
matching yet) is logged and the previous one keeps serving; it is retried on later handshakes.

The context handed to the server stays the same object throughout; only the context each new
connection switches to (in the SNI callback, which OpenSSL calls for every handshake, with or
without a server name) changes. Established connections keep the certificate they began with.
"""
from __future__ import annotations

import os
import ssl
import time
from typing import Callable

import structlog

log = structlog.get_logger(__name__)

DEFAULT_CHECK_INTERVAL_S = 1.0


class TLSConfigError(OSError):
    """The certificate or key cannot be loaded at start-up; the message says which and why."""


def _server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # TLS 1.2+, no client certs
    context.load_cert_chain(cert_file, key_file)
    return context


class ReloadingTLS:
    """The server's SSLContext (``.context``) and the certificate pair behind it."""

    def __init__(self, *, cert_file: str, key_file: str, check_interval_s: float = DEFAULT_CHECK_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        self.cert_file = cert_file
        self.key_file = key_file
        self.check_interval_s = check_interval_s
        self.reloads = 0
        self._clock = clock
        try:
            self._loaded_signature = self._signature()
            self._current = _server_context(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(f"cannot load TLS certificate {cert_file} with key {key_file}: {exc}") from None
        self._rejected_signature: tuple | None = None
        self._last_check = clock()
        self.context = self._current
        self.context.sni_callback = self._on_handshake

    def _signature(self) -> tuple:
        """What changes when either file is replaced (atomic Secret updates swap symlinks,
        so the target's inode changes even when the timestamps would not)."""
        parts = []
        for path in (self.cert_file, self.key_file):
            st = os.stat(path)
            parts.append((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        return tuple(parts)

    def reload_if_changed(self) -> bool:
        """Load the pair when the files changed since the last good load; True when a new
        pair is now served. Never raises: a bad pair is logged and the old one kept."""
        self._last_check = self._clock()
        try:
            signature = self._signature()
        except OSError as exc:
            self._reject(("missing", str(exc)), f"cannot stat certificate files: {exc}")
            return False
        if signature == self._loaded_signature:
            return False
        try:
            fresh = _server_context(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            self._reject(signature, str(exc))
            return False
        self._current = fresh
        self._loaded_signature = signature
        self._rejected_signature = None
        self.reloads += 1
        log.info("TLS certificate reloaded", cert_file=self.cert_file, reloads=self.reloads)
        return True

    def _reject(self, signature: tuple, error: str) -> None:
        if signature != self._rejected_signature:  # once per distinct state, not per handshake
            log.warning("TLS certificate not reloaded, still serving the previous one",
                        cert_file=self.cert_file, key_file=self.key_file, error=error)
            self._rejected_signature = signature

    def _on_handshake(self, connection: ssl.SSLObject, server_name: str | None, _context) -> None:
        try:
            if self._clock() - self._last_check >= self.check_interval_s:
                self.reload_if_changed()
            if self._current is not self.context:
                connection.context = self._current
        except Exception:  # noqa: BLE001 - an exception here would abort the handshake
            log.exception("TLS certificate check failed")
        return None
