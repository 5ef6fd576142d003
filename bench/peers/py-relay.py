"""A Python `websockets` relay that routes {"to": id} messages by id, like the Modulr
reference signalling script. Usage: python3 py-relay.py PORT.
Connect as ws://127.0.0.1:PORT/?id=ID; it acks {"welcome": ID}."""
import asyncio
import json
import os
import signal
import sys
from urllib.parse import parse_qs, urlparse

from websockets.asyncio.server import serve

peers = {}


async def handler(socket):
    peer_id = parse_qs(urlparse(socket.request.path).query).get("id", [""])[0]
    peers[peer_id] = socket
    await socket.send(json.dumps({"welcome": peer_id}))
    try:
        async for message in socket:
            try:
                to = json.loads(message)["to"]
            except (ValueError, KeyError, TypeError):
                continue
            peer = peers.get(to)
            if peer is not None:
                await peer.send(message)
    finally:
        if peers.get(peer_id) is socket:
            del peers[peer_id]


async def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9003
    async with serve(handler, "127.0.0.1", port, max_size=65536, ping_interval=None):
        print(f"listening 127.0.0.1:{port}", flush=True)
        await asyncio.Future()


# The bench stops its peers with SIGINT. Closing the server waits for every connection's
# closing handshake, which peers that already went away never complete (the bench then
# waited its 180 s and killed it): a relay with nothing to save exits at once.
signal.signal(signal.SIGINT, lambda *_: os._exit(0))
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
asyncio.run(main())
