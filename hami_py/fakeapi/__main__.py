"""Run the fake kube-apiserver on its own, for the demo or for poking at it with kubectl/curl.

    python -m hami_py.fakeapi [--port N] [--kubeconfig PATH]
"""
from __future__ import annotations

import argparse
import asyncio
import signal

import structlog

from hami_py.fakeapi.server import FakeApiServer, write_kubeconfig

log = structlog.get_logger()


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hami_py.fakeapi", description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free)")
    parser.add_argument("--kubeconfig", help="also write a kubeconfig pointing at the server here")
    parser.add_argument("--bookmark-interval", type=float, default=None,
                        help="seconds between watch bookmarks (default: none)")
    return parser.parse_args()


async def _serve(*, port: int, kubeconfig: str | None, bookmark_interval: float | None) -> None:
    server = FakeApiServer(bookmark_interval=bookmark_interval)
    url = await server.start(port=port)
    if kubeconfig:
        write_kubeconfig(kubeconfig, url)
    log.info("fakeapi.listening", url=url, kubeconfig=kubeconfig)
    stopped = asyncio.Event()
    # SIGTERM (how a demo script or CI stops us) shuts down as cleanly as Ctrl-C does.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
    try:
        await stopped.wait()             # or until Ctrl-C cancels us
    finally:
        await server.stop()
        log.info("fakeapi.stopped")


def main() -> None:
    args = _parse_args()
    try:
        asyncio.run(_serve(port=args.port, kubeconfig=args.kubeconfig,
                           bookmark_interval=args.bookmark_interval))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
