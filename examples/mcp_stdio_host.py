#!/usr/bin/env python3
"""An MCP host on the official MCP Python SDK (`pip install mcp`) that runs arp-bridge as its
stdio MCP server, as Claude Desktop or any `mcpServers` host does.

    ARP_TOKEN=… python3 examples/mcp_stdio_host.py --bridge target/debug/arp-bridge \\
        --url wss://SERVER/v1/robots/ROBOT/arp

lists the robot's tools and takes one picture. `--check` is the test run
(`cargo test -p arp-bridge`): capture_image is image content that decodes as a JPEG, and a
call the robot wants a person to confirm is put to this host's user through elicitation,
declined first (the call fails, -40006) and then accepted (it runs).
"""

import argparse
import asyncio
import base64
import io
import os
import re
import sys

from mcp import ClientSession, types
from mcp.client.stdio import StdioServerParameters, stdio_client


def g(obj, name):
    """Attribute `name` (camelCase, as MCP spells it): SDK 2.x names it in snake_case."""
    snake = re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()
    return getattr(obj, snake) if hasattr(obj, snake) else getattr(obj, name)


def decodes(image):
    """The image content is a JPEG that decodes (with Pillow where installed)."""
    raw = base64.b64decode(image.data)
    if g(image, "mimeType") != "image/jpeg" or raw[:2] != b"\xff\xd8":
        return False
    try:
        from PIL import Image
    except ImportError:
        print("  (Pillow not installed: the JPEG's markers checked, not decoded)")
        return raw[-2:] == b"\xff\xd9"
    with Image.open(io.BytesIO(raw)) as picture:
        picture.load()
        return picture.format == "JPEG" and picture.size[0] > 0


def bridge(path, url):
    """arp-bridge in MCP mode; the token goes in its environment (ARP_TOKEN), never on its
    command line."""
    env = dict(os.environ)
    return StdioServerParameters(command=path, args=["--mode", "mcp", "--url", url], env=env)


async def check(params):
    results = []

    def expect(name, ok, detail=""):
        results.append(ok)
        print(f"{'ok  ' if ok else 'FAIL'} {name}{'' if ok else ': ' + str(detail)}")

    asked = []

    async def elicit(context, request):
        asked.append(request.message)
        if len(asked) == 1:
            return types.ElicitResult(action="decline")
        return types.ElicitResult(action="accept", content={"confirm": True})

    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, elicitation_callback=elicit) as s:
            init = await s.initialize()
            expect("initialize", g(init, "serverInfo").name == "arp-bridge", init)
            names = {t.name for t in (await s.list_tools()).tools}
            expect("tools/list has capture_image and save_location",
                   {"capture_image", "save_location", "emergency_stop"} <= names, names)
            shot = await s.call_tool("capture_image", {})
            image = next((c for c in shot.content if c.type == "image"), None)
            expect("capture_image is a JPEG that decodes",
                   not g(shot, "isError") and image is not None and decodes(image), shot)
            declined = await s.call_tool("save_location", {"name": "dock"})
            code = (g(declined, "structuredContent") or {}).get("error", {}).get("code")
            expect("a declined elicitation fails the call (-40006)",
                   g(declined, "isError") and code == -40006 and len(asked) == 1, (declined, asked))
            expect("the question names the tool", asked and "save_location" in asked[0], asked)
            confirmed = await s.call_tool("save_location", {"name": "dock"})
            expect("an accepted elicitation runs the call",
                   not g(confirmed, "isError") and len(asked) == 2, (confirmed, asked))
            saved = await s.call_tool("list_locations", {})
            expect("the confirmed call took effect", "dock" in str(g(saved, "structuredContent")), saved)
    failed = results.count(False)
    print(f"mcp stdio check: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


async def show(params):
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            print(f"{g(init, 'serverInfo').title}")
            for tool in (await s.list_tools()).tools:
                print(f"  tool {tool.name}")
            shot = await s.call_tool("capture_image", {})
            image = next((c for c in shot.content if c.type == "image"), None)
            if image is not None:
                print(f"  capture_image: {len(base64.b64decode(image.data))} bytes of {g(image, 'mimeType')}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bridge", default="arp-bridge", help="the arp-bridge executable")
    parser.add_argument("--url", required=True, help="the ARP endpoint (ws:// or wss://)")
    parser.add_argument("--check", action="store_true", help="the test run (see above)")
    args = parser.parse_args()
    params = bridge(args.bridge, args.url)
    if args.check:
        return asyncio.run(check(params))
    asyncio.run(show(params))
    return 0


if __name__ == "__main__":
    sys.exit(main())
