#!/usr/bin/env python3
"""ARP client example: drive a square with robot-agent's `drive` tool.

Connects to an ARP 0.1.0 endpoint (robot-agent's `--arp-listen` socket, or
the server's gateway), initializes, lists the tools, follows the odometry,
drives a square (four sides, four quarter turns), then triggers an
emergency stop and resets it. Needs only the `websockets` package:

    pip install websockets
    python3 examples/arp_square.py ws://127.0.0.1:7700 --token SECRET

See docs/robot-agent.md ("ARP") and docs/arp.md.
"""

import argparse
import asyncio
import itertools
import json
import math
import sys

import websockets


class ArpClient:
    """A minimal JSON-RPC 2.0 client: one reader task routes responses to
    their waiters and notifications to a queue."""

    def __init__(self, ws):
        self.ws = ws
        self.ids = itertools.count(1)
        self.waiting = {}
        self.notifications = asyncio.Queue()
        self.pose = None
        self.reader = asyncio.create_task(self._read())

    async def _read(self):
        async for text in self.ws:
            message = json.loads(text)
            method = message.get("method")
            if method == "arp.contextUpdate" and message["params"]["name"] == "odometry":
                self.pose = message["params"]["data"]
            elif method == "arp.requestConfirmation":
                await self._confirm(message)
            elif method is not None:
                await self.notifications.put(message)
            elif message.get("id") in self.waiting:
                self.waiting.pop(message["id"]).set_result(message)

    async def _confirm(self, request):
        # ARP: a human decides. On a terminal, ask; otherwise say no.
        params = request["params"]
        confirmed = False
        if sys.stdin.isatty():
            answer = await asyncio.to_thread(
                input, f"Robot asks to confirm: {params['action']} [y/N] "
            )
            confirmed = answer.strip().lower() == "y"
        await self.ws.send(json.dumps({
            "jsonrpc": "2.0",
            "id": request["id"],
            "result": {
                "confirmed": confirmed,
                "confirmedBy": "arp_square.py user",
                "timestamp": "1970-01-01T00:00:00Z",
            },
        }))

    async def call(self, method, params=None, timeout=60):
        request_id = next(self.ids)
        future = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = future
        await self.ws.send(json.dumps({
            "jsonrpc": "2.0", "id": request_id, "method": method, "params": params or {},
        }))
        response = await asyncio.wait_for(future, timeout)
        if "error" in response:
            error = response["error"]
            raise RuntimeError(f"{method}: {error['code']} {error['message']} {error.get('data', '')}")
        return response["result"]

    async def tool(self, name, **arguments):
        return await self.call("arp.callTool", {"name": name, "arguments": arguments})


def describe(pose):
    if pose is None:
        return "pose unknown"
    p, q = pose["position"], pose["orientation"]
    yaw = 2 * math.atan2(q["z"], q["w"])
    return f"x={p['x']:+.2f} y={p['y']:+.2f} yaw={math.degrees(yaw):+.0f}°"


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="ws://HOST:PORT of the ARP endpoint")
    parser.add_argument("--token", help="the secret of an operator token")
    parser.add_argument("--side", type=float, default=0.5, help="side of the square, m")
    parser.add_argument("--speed", type=float, default=0.25, help="m/s")
    parser.add_argument("--turn-rate", type=float, default=1.0, help="rad/s")
    args = parser.parse_args()

    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    async with websockets.connect(args.url, additional_headers=headers) as ws:
        client = ArpClient(ws)
        info = await client.call("arp.initialize", {
            "protocolVersion": "0.1.0",
            "clientInfo": {"name": "arp_square.py", "version": "1.0"},
            "capabilities": {"confirmation": True, "planning": False},
        })
        print(f"connected to {info['serverInfo']['name']} {info['serverInfo']['version']}")
        tools = await client.call("arp.listTools")
        for tool in tools["tools"]:
            print(f"  tool {tool['name']:<22} {tool['safety']['level']:<9} {tool['description']}")
        sources = await client.call("arp.listContext")
        if any(s["name"] == "odometry" for s in sources["sources"]):
            await client.call("arp.subscribeContext", {"name": "odometry", "maxRate": 10})

        for side in range(4):
            done = await client.tool("drive", linear=args.speed, angular=0.0,
                                     durationSecs=args.side / args.speed)
            await client.tool("drive", linear=0.0, angular=args.turn_rate,
                              durationSecs=(math.pi / 2) / args.turn_rate)
            print(f"side {side + 1}: {done['state']}, {describe(client.pose)}")

        stopped = await client.call("arp.emergencyStop", {"reason": "end of the square demo"})
        if stopped.get("stopped"):
            print("emergency stop latched")
        try:
            await client.tool("drive", linear=0.1, angular=0.0, durationSecs=1.0)
        except RuntimeError as refused:
            print(f"while latched: {refused}")
        await client.tool("reset_emergency_stop")
        print("emergency stop reset")
        await client.call("arp.shutdown")
        client.reader.cancel()


if __name__ == "__main__":
    asyncio.run(main())
