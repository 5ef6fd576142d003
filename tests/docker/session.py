#!/usr/bin/env python3
"""A browser-less client of the signalling WebSocket for tests/docker/run.sh.

  session.py WS_URL TOKEN ROBOT_ID [--hold SECONDS] [--timeout SECONDS]

Logs in with a client token, opens a session with ROBOT_ID (signalling.offer with a real
WebRTC data-channel offer, which robot-agent answers as a peer) and prints one JSON line
{"connectionId", "answered": true} once the robot's signalling.answer arrives; exit 1 if it
does not within --timeout. With --hold, it then keeps the session open and prints one JSON
line per end it sees ({"event": "disconnected", "reason"} or {"event": "closed"}), exiting
0 at the first, 3 if none came within SECONDS. Bounded: it never waits longer than told.
Needs the `websockets` package (run.sh installs it).
"""
import argparse
import asyncio
import json
import secrets
import sys
import uuid
from datetime import datetime, timezone

from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed


def envelope(kind, payload):
    return {
        "type": kind,
        "version": "0.3",
        "id": str(uuid.uuid4()),
        "timestamp": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "payload": payload,
    }


def offer_sdp():
    """A data-channel offer as a browser makes it (no candidates: signalling only)."""
    fingerprint = ":".join(f"{b:02X}" for b in secrets.token_bytes(32))
    lines = [
        "v=0",
        f"o=- {secrets.randbelow(2**62)} 2 IN IP4 127.0.0.1",
        "s=-",
        "t=0 0",
        "a=group:BUNDLE 0",
        "a=msid-semantic: WMS",
        "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
        "c=IN IP4 0.0.0.0",
        f"a=ice-ufrag:{secrets.token_hex(4)}",
        f"a=ice-pwd:{secrets.token_hex(12)}",
        "a=ice-options:trickle",
        f"a=fingerprint:sha-256 {fingerprint}",
        "a=setup:actpass",
        "a=mid:0",
        "a=sctp-port:5000",
        "a=max-message-size:262144",
    ]
    return "\r\n".join(lines) + "\r\n"


async def receive(socket, deadline):
    loop = asyncio.get_running_loop()
    remaining = deadline - loop.time()
    if remaining <= 0:
        raise TimeoutError
    return json.loads(await asyncio.wait_for(socket.recv(), remaining))


async def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ws")
    parser.add_argument("token")
    parser.add_argument("robot")
    parser.add_argument("--hold", type=float, default=0)
    parser.add_argument("--timeout", type=float, default=20)
    args = parser.parse_args()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + args.timeout
    url = f"{args.ws}?token={args.token}"
    async with connect(url, open_timeout=args.timeout, max_size=1 << 20) as socket:
        connection_id = None
        while connection_id is None:
            message = await receive(socket, deadline)
            if message.get("type") == "signalling.welcome":
                connection_id = message["payload"]["connectionId"]
        sent = envelope(
            "signalling.offer",
            {
                "robotId": args.robot,
                "connectionId": connection_id,
                "sdp": offer_sdp(),
                "sdpType": "offer",
            },
        )
        await socket.send(json.dumps(sent))
        while True:
            message = await receive(socket, deadline)
            kind = message.get("type")
            if kind == "signalling.answer":
                break
            if kind == "signalling.error":
                print(json.dumps({"error": message.get("payload")}), flush=True)
                return 1
        print(json.dumps({"connectionId": connection_id, "answered": True}), flush=True)
        if args.hold <= 0:
            return 0
        deadline = loop.time() + args.hold
        try:
            while True:
                message = await receive(socket, deadline)
                if message.get("type") == "signalling.disconnected":
                    payload = message.get("payload", {})
                    reason = payload.get("details", {}).get("reason") or payload.get("reason")
                    print(json.dumps({"event": "disconnected", "reason": reason}), flush=True)
                    return 0
        except ConnectionClosed as closed:
            print(json.dumps({"event": "closed", "code": closed.rcvd.code if closed.rcvd else None}), flush=True)
            return 0
        except TimeoutError:
            return 3


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main()))
    except (TimeoutError, asyncio.TimeoutError):
        print(json.dumps({"error": "timed out"}), flush=True)
        sys.exit(1)
