#!/usr/bin/env python3
"""An MCP host on the server's remote MCP endpoint, with the official MCP Python SDK.

The robot is an MCP server at `/v1/robots/{robotId}/mcp` (Streamable HTTP), reached with a
client token in `Authorization: Bearer`; no bridge to install. This lists the robot's tools
and resources, reads its pose, and with `--drive` makes one short `drive` call (it goes on
the robot's audit record like any program's call). See docs/arp.md ("The remote MCP
endpoint").

    pip install mcp
    MCP_TOKEN=T python3 examples/mcp_remote_host.py --server http://127.0.0.1:8080 --robot-id R --drive

`--check` is the test crates/agent-server-tests/tests/mcp_endpoint.rs runs: the operator's
session drives the sim robot, a viewer's is refused motion, no token is 401 and a token
without a grant 403 (the tokens in MCP_TOKEN, MCP_VIEWER_TOKEN, MCP_STRANGER_TOKEN).
"""

import argparse
import asyncio
import contextlib
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request

from mcp import ClientSession, types
from mcp.client import streamable_http

from mcp_host_kit import Checks, declines_then_confirms, decodes, error_code, g, image_of

DRIVE = {"linear": 0.3, "angular": 0.0, "durationSecs": 0.5}


def endpoint(server, robot_id):
    """`http(s)://host[:port]` → `http(s)://host[:port]/v1/robots/{id}/mcp`."""
    return f"{server.rstrip('/')}/v1/robots/{urllib.parse.quote(robot_id, safe='')}/mcp"


@contextlib.asynccontextmanager
async def session(url, token, get_stream=True):
    """The Streamable HTTP transport with the token, on SDK 1.x and 2.x alike: its (read,
    write) streams. `get_stream=False`: a host that opens no GET stream (what the server
    sends it must come on its requests' own SSE streams)."""
    if not get_stream:
        async def no_get_stream(*_args, **_kwargs):
            return None

        transport = streamable_http.StreamableHTTPTransport
        opened, transport.handle_get_stream = transport.handle_get_stream, no_get_stream
        try:
            async with session(url, token) as streams:
                yield streams
        finally:
            transport.handle_get_stream = opened
        return
    headers = {"Authorization": f"Bearer {token}"}
    if hasattr(streamable_http, "streamablehttp_client"):
        async with streamable_http.streamablehttp_client(url, headers=headers) as (read, write, _):
            yield read, write
    else:
        http = streamable_http.create_mcp_http_client(headers=headers)
        async with http, streamable_http.streamable_http_client(url, http_client=http) as streams:
            yield streams[0], streams[1]


def status_of(url, body, token=None):
    """The HTTP status of one POST (the refusals come before any MCP exchange)."""
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


async def pose_x(s):
    read = await s.read_resource("arp://context/odometry")
    return json.loads(read.contents[0].text)["data"]["position"]["x"]


async def show(url, token, drive):
    async with session(url, token) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            print(f"{g(init, 'serverInfo').title} (MCP {g(init, 'protocolVersion')})")
            for tool in (await s.list_tools()).tools:
                hints = tool.annotations
                print(f"  tool {tool.name}: readOnly={g(hints, 'readOnlyHint')} destructive={g(hints, 'destructiveHint')}")
            for resource in (await s.list_resources()).resources:
                print(f"  resource {resource.uri}")
            print(f"  x = {await pose_x(s):.3f} m")
            if drive:
                result = await s.call_tool("drive", DRIVE)
                print(f"  drive: {result.content[0].text}")
                print(f"  x = {await pose_x(s):.3f} m")
            else:
                print("  (no call made: --drive makes one, and the audit shows it)")


async def keyed_call(s, name, arguments, key):
    """`tools/call` with `_meta.idempotencyKey` (a retry with the same key runs once)."""
    return await s.call_tool(name, arguments, meta={"idempotencyKey": key})


async def check(url, operator, viewer, stranger):
    checks = Checks("mcp check")
    expect = checks.expect
    # The robot asks a person before save_location (policy `client`): this host's user
    # answers through elicitation, first declining, then confirming.
    answers = []
    elicit = declines_then_confirms(answers)

    # What the server sends unasked: resource updates of a subscription.
    updated = asyncio.Event()

    async def on_message(message):
        note = getattr(message, "root", message)
        if type(note).__name__ == "ResourceUpdatedNotification":
            if str(note.params.uri) == "arp://context/odometry":
                updated.set()

    async with session(url, operator) as (read, write):
        async with ClientSession(read, write, elicitation_callback=elicit, message_handler=on_message) as s:
            init = await s.initialize()
            expect("initialize", g(init, "protocolVersion") == "2025-06-18" and init.capabilities.tools is not None, init)
            names = {t.name for t in (await s.list_tools()).tools}
            expect("tools/list has drive, stop, emergency_stop", {"drive", "stop", "emergency_stop"} <= names, names)
            uris = {str(r.uri) for r in (await s.list_resources()).resources}
            expect("resources/list has the odometry", "arp://context/odometry" in uris, uris)
            before = await pose_x(s)
            result = await s.call_tool("drive", DRIVE)
            expect("drive completes", not g(result, "isError") and g(result, "structuredContent").get("state") == "completed", result)
            after = await pose_x(s)
            expect("drive moved the sim robot", after > before + 0.05, (before, after))
            tools = {t.name: t for t in (await s.list_tools()).tools}
            drive = tools["drive"]
            expect("drive's hints: destructive, not read-only",
                   g(drive.annotations, "destructiveHint") is True and g(drive.annotations, "readOnlyHint") is False,
                   drive.annotations)
            expect("list_locations' hints: read-only", g(tools["list_locations"].annotations, "readOnlyHint") is True,
                   tools["list_locations"].annotations)
            expect("drive's schema says the velocity limit",
                   g(drive, "inputSchema")["properties"]["linear"].get("maximum") == 0.5, g(drive, "inputSchema"))
            # Eyes: one frame, as MCP image content that decodes.
            shot = await s.call_tool("capture_image", {})
            image = image_of(shot)
            expect("capture_image is a 320x240 JPEG that decodes",
                   image is not None and decodes(image, (320, 240)), shot)
            # A retry with the same key moves the robot once.
            first = await keyed_call(s, "drive", DRIVE, "retry-1")
            moved = await pose_x(s)
            again = await keyed_call(s, "drive", DRIVE, "retry-1")
            still = await pose_x(s)
            expect("a keyed retry runs once",
                   not g(first, "isError") and g(first, "structuredContent") == g(again, "structuredContent")
                   and moved > after + 0.05 and abs(still - moved) < 0.02,
                   (first, again, after, moved, still))
            # A subscription: updates come as notifications/resources/updated.
            await s.subscribe_resource("arp://context/odometry")
            try:
                await asyncio.wait_for(updated.wait(), 5)
            except asyncio.TimeoutError:
                pass
            expect("resources/subscribe yields notifications/resources/updated", updated.is_set())
            await s.unsubscribe_resource("arp://context/odometry")
            constraints = json.loads((await s.read_resource("arp://constraints")).contents[0].text)
            expect("arp://constraints", any(c["type"] == "velocity_limit" for c in constraints["constraints"]),
                   constraints)
            prompts = {p.name for p in (await s.list_prompts()).prompts}
            prompt = await s.get_prompt("go_to_location_and_report", {"location": "dock"})
            expect("prompts", {"inspect_surroundings", "go_to_location_and_report"} <= prompts
                   and "dock" in prompt.messages[0].content.text, (prompts, prompt))
            # Confirmation through elicitation: declined, then confirmed.
            declined = await s.call_tool("save_location", {"name": "dock"})
            expect("a declined elicitation refuses the call (-40006)",
                   g(declined, "isError") and error_code(declined) == -40006 and len(answers) == 1,
                   (declined, answers))
            confirmed = await s.call_tool("save_location", {"name": "dock"})
            expect("a confirmed elicitation runs the call", not g(confirmed, "isError") and len(answers) == 2,
                   (confirmed, answers))
    # A host with no GET stream is asked on its call's own stream (SSE); declining there
    # refuses the call all the same.
    asked = []

    async def decline(context, params):
        asked.append(params.message)
        return types.ElicitResult(action="decline")

    async with session(url, operator, get_stream=False) as (read, write):
        async with ClientSession(read, write, elicitation_callback=decline) as s:
            await s.initialize()
            declined = await asyncio.wait_for(s.call_tool("save_location", {"name": "dock"}), 20)
            expect("without a GET stream, asked on the call's stream; declined: -40006",
                   g(declined, "isError") and error_code(declined) == -40006 and len(asked) == 1,
                   (declined, asked))
    async with session(url, viewer) as (read, write):
        async with ClientSession(read, write) as s:
            await s.initialize()
            result = await s.call_tool("drive", DRIVE)
            error = (g(result, "structuredContent") or {}).get("error", {})
            expect("a viewer is refused motion (-40001 forbidden)",
                   g(result, "isError") and error.get("code") == -40001 and error.get("data", {}).get("reason") == "forbidden",
                   result)
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "check", "version": "0"}}}
    anonymous = await asyncio.to_thread(status_of, url, init)
    expect("no token: 401", anonymous == 401, anonymous)
    denied = await asyncio.to_thread(status_of, url, init, stranger)
    expect("no grant: 403", denied == 403, denied)
    return checks.summary()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="http://127.0.0.1:8080")
    parser.add_argument("--robot-id")
    parser.add_argument("--url", help="the endpoint itself (instead of --server and --robot-id)")
    parser.add_argument("--drive", action="store_true", help="make one short drive call")
    parser.add_argument("--check", action="store_true", help="the test run (see above)")
    args = parser.parse_args()
    url = args.url or (args.robot_id and endpoint(args.server, args.robot_id))
    token = os.environ.get("MCP_TOKEN")
    if not url or not token:
        parser.error("--url (or --robot-id) and the environment variable MCP_TOKEN are required")
    if args.check:
        return asyncio.run(check(url, token, os.environ["MCP_VIEWER_TOKEN"], os.environ["MCP_STRANGER_TOKEN"]))
    asyncio.run(show(url, token, args.drive))
    return 0


if __name__ == "__main__":
    sys.exit(main())
