"""A TCP port forward, as Session Manager or an SSH tunnel gives one: 127.0.0.1:PORT here to ADDRESS:PORT.

    python -m rehearsal.forward LOCAL_PORT ADDRESS PORT
"""

from __future__ import annotations

import asyncio
import contextlib
import sys


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(ConnectionError, OSError):
        writer.close()


async def main(local_port: int, address: str, port: int) -> None:
    async def connected(reader, writer):
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(address, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    server = await asyncio.start_server(connected, "127.0.0.1", local_port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
