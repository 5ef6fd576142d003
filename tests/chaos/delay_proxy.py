#!/usr/bin/env python3
"""A TCP proxy that can delay what it carries (the kernel here has no netem): fault 5
puts it between node 0 and Redis. Each direction keeps its order; every chunk is held
for the delay in milliseconds read from DELAY_FILE (0 or missing: none).

usage: delay_proxy.py LISTEN_HOST LISTEN_PORT TARGET_PORT DELAY_FILE
"""
import asyncio
import sys
import time

LISTEN_HOST, LISTEN_PORT, TARGET_PORT, DELAY_FILE = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]


def delay():
    try:
        with open(DELAY_FILE) as f:
            return int(f.read().strip() or 0) / 1000
    except (OSError, ValueError):
        return 0.0


async def pipe(reader, writer):
    queue = asyncio.Queue(maxsize=1024)

    async def read():
        try:
            while data := await reader.read(65536):
                await queue.put((time.monotonic() + delay(), data))
        except OSError:
            pass
        await queue.put((0, b""))

    async def write():
        try:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    await asyncio.gather(read(), write())


async def handle(client_reader, client_writer):
    try:
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", TARGET_PORT)
    except OSError:
        client_writer.close()
        return
    await asyncio.gather(pipe(client_reader, server_writer), pipe(server_reader, client_writer))


async def main():
    server = await asyncio.start_server(handle, LISTEN_HOST, LISTEN_PORT)
    async with server:
        await server.serve_forever()


asyncio.run(main())
