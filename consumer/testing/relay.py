"""`TcpRelay`: a loopback TCP relay in front of a real server, cut and restored at will, so a
test can make that server unreachable (connections refused and dropped) and bring it back
without losing its state."""

from __future__ import annotations

import asyncio
import contextlib

from consumer.testing.ports import free_port

__all__ = ["TcpRelay"]


class TcpRelay:
    """`async with TcpRelay(host, port) as relay:` listens on 127.0.0.1:`relay.port`; while
    `cut`, every connection to it is closed at once and the open ones are dropped."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = free_port()
        self.cut = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> TcpRelay:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.disconnect()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def disconnect(self) -> None:
        """Cut: drop the open connections, refuse new ones until `reconnect`."""
        self.cut = True
        for writer in list(self._writers):
            writer.close()
        self._writers.clear()

    def reconnect(self) -> None:
        self.cut = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        self._writers.update((writer, up_writer))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError, asyncio.IncompleteReadError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self._writers.discard(writer)
        self._writers.discard(up_writer)
