"""TLS on the extender/webhook port: served with the configured pair, and a pair rotated on disk
is what the next connection gets, without a restart.

Every check is a real TLS handshake on loopback whose peer certificate is compared with the one
on disk; certificates are throwaway ones from trustme.
"""
from __future__ import annotations

import asyncio
import os
import ssl
from contextlib import asynccontextmanager

import pytest
import trustme

from hami_py.embedded import embedded_options, running_scheduler
from hami_py.http.tls import ReloadingTLS, TLSConfigError

HOSTS = ("127.0.0.1", "localhost")


def der_of(cert: trustme.LeafCert) -> bytes:
    return ssl.PEM_cert_to_DER_cert(cert.cert_chain_pems[0].bytes().decode())


def write_atomically(path: str, data: bytes) -> None:
    """As a careful tool writes: a new file renamed over the old one."""
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def install(cert: trustme.LeafCert, cert_file: str, key_file: str) -> None:
    write_atomically(cert_file, cert.cert_chain_pems[0].bytes())
    write_atomically(key_file, cert.private_key_pem.bytes())


@pytest.fixture
def pair(ca, tmp_path):
    cert_file, key_file = str(tmp_path / "tls.crt"), str(tmp_path / "tls.key")
    first = ca.issue_cert(*HOSTS)
    install(first, cert_file, key_file)
    return cert_file, key_file, first


@asynccontextmanager
async def tls_server(context: ssl.SSLContext):
    async def hang_up(_reader, writer):
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
async def listener(pair):
    """A loopback TLS listener serving ``pair`` through a ReloadingTLS that looks at the files on
    every handshake: (the ReloadingTLS, the port)."""
    cert_file, key_file, _ = pair
    tls = ReloadingTLS(cert_file=cert_file, key_file=key_file, check_interval_s=0)
    async with tls_server(tls.context) as port:
        yield tls, port


async def served_certificate(ca: trustme.CA, port: int) -> bytes:
    """The certificate a new, verifying connection is shown (DER)."""
    client = ssl.create_default_context()
    ca.configure_trust(client)
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="localhost")
    try:
        return writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()


async def test_rotated_pair_is_served_to_the_next_connection(ca, pair, listener):
    cert_file, key_file, first = pair
    tls, port = listener
    assert await served_certificate(ca, port) == der_of(first)
    second = ca.issue_cert(*HOSTS)
    install(second, cert_file, key_file)
    assert await served_certificate(ca, port) == der_of(second)
    assert await served_certificate(ca, port) == der_of(second)
    assert tls.reloads == 1


async def test_half_rotated_pair_keeps_the_old_certificate_until_the_key_arrives(ca, pair, listener):
    cert_file, key_file, first = pair
    tls, port = listener
    second = ca.issue_cert(*HOSTS)
    write_atomically(cert_file, second.cert_chain_pems[0].bytes())  # key not yet replaced
    assert await served_certificate(ca, port) == der_of(first)
    write_atomically(key_file, second.private_key_pem.bytes())
    assert await served_certificate(ca, port) == der_of(second)
    assert tls.reloads == 1


async def test_missing_files_keep_the_old_certificate(ca, pair, listener):
    cert_file, key_file, first = pair
    _, port = listener
    os.remove(cert_file)
    assert await served_certificate(ca, port) == der_of(first)
    second = ca.issue_cert(*HOSTS)
    install(second, cert_file, key_file)
    assert await served_certificate(ca, port) == der_of(second)


async def test_secret_volume_update_is_picked_up(ca, tmp_path):
    """kubelet updates a Secret volume by pointing the ..data symlink at a new directory."""
    def publish(cert: trustme.LeafCert, version: str) -> None:
        directory = tmp_path / version
        directory.mkdir()
        cert.cert_chain_pems[0].write_to_path(str(directory / "tls.crt"))
        cert.private_key_pem.write_to_path(str(directory / "tls.key"))
        os.symlink(version, tmp_path / "..data_tmp")
        os.replace(tmp_path / "..data_tmp", tmp_path / "..data")

    first, second = ca.issue_cert(*HOSTS), ca.issue_cert(*HOSTS)
    publish(first, "..v1")
    for name in ("tls.crt", "tls.key"):
        os.symlink(f"..data/{name}", tmp_path / name)
    tls = ReloadingTLS(cert_file=str(tmp_path / "tls.crt"), key_file=str(tmp_path / "tls.key"), check_interval_s=0)
    async with tls_server(tls.context) as port:
        assert await served_certificate(ca, port) == der_of(first)
        publish(second, "..v2")
        assert await served_certificate(ca, port) == der_of(second)


async def test_files_are_checked_at_most_once_per_interval(ca, pair):
    cert_file, key_file, first = pair
    now = [1000.0]
    tls = ReloadingTLS(cert_file=cert_file, key_file=key_file, check_interval_s=5, clock=lambda: now[0])
    async with tls_server(tls.context) as port:
        second = ca.issue_cert(*HOSTS)
        install(second, cert_file, key_file)
        now[0] += 4.9
        assert await served_certificate(ca, port) == der_of(first)
        now[0] += 0.2
        assert await served_certificate(ca, port) == der_of(second)


def test_unusable_pair_at_start_names_the_files(ca, tmp_path, pair):
    cert_file, key_file, _ = pair
    other = ca.issue_cert(*HOSTS)
    other.private_key_pem.write_to_path(key_file)  # key of another certificate
    with pytest.raises(TLSConfigError, match=f"cannot load TLS certificate {cert_file} with key {key_file}"):
        ReloadingTLS(cert_file=cert_file, key_file=key_file)
    with pytest.raises(TLSConfigError, match="No such file"):
        ReloadingTLS(cert_file=str(tmp_path / "absent.crt"), key_file=key_file)


async def test_scheduler_serves_https_and_reloads_a_rotated_pair(api, ca, pair):
    cert_file, key_file, first = pair
    options = embedded_options(cert_file=cert_file, key_file=key_file, cert_check_interval_s=0)
    async with running_scheduler(api, options=options, wait_ready=False, device_plugin=False) as app:
        port = int(app.url.rsplit(":", 1)[1])
        assert app.url.startswith("https://")
        assert await served_certificate(ca, port) == der_of(first)
        second = ca.issue_cert(*HOSTS)
        install(second, cert_file, key_file)
        assert await served_certificate(ca, port) == der_of(second)
        assert app.tls.reloads == 1
