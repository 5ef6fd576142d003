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
import os
import sys

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from mcp_host_kit import Checks, declines_then_confirms, decodes, error_code, g, image_of


def bridge(path, url):
    """arp-bridge in MCP mode; the token goes in its environment (ARP_TOKEN), never on its
    command line."""
    env = dict(os.environ)
    return StdioServerParameters(command=path, args=["--mode", "mcp", "--url", url], env=env)


async def check(params):
    checks = Checks("mcp stdio check")
    expect = checks.expect
    asked = []
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, elicitation_callback=declines_then_confirms(asked)) as s:
            init = await s.initialize()
            expect("initialize", g(init, "serverInfo").name == "arp-bridge", init)
            names = {t.name for t in (await s.list_tools()).tools}
            expect("tools/list has capture_image and save_location",
                   {"capture_image", "save_location", "emergency_stop"} <= names, names)
            shot = await s.call_tool("capture_image", {})
            image = image_of(shot)
            expect("capture_image is a JPEG that decodes",
                   not g(shot, "isError") and image is not None and decodes(image), shot)
            declined = await s.call_tool("save_location", {"name": "dock"})
            expect("a declined elicitation fails the call (-40006)",
                   g(declined, "isError") and error_code(declined) == -40006 and len(asked) == 1,
                   (declined, asked))
            expect("the question names the tool", asked and "save_location" in asked[0], asked)
            confirmed = await s.call_tool("save_location", {"name": "dock"})
            expect("an accepted elicitation runs the call",
                   not g(confirmed, "isError") and len(asked) == 2, (confirmed, asked))
            saved = await s.call_tool("list_locations", {})
            expect("the confirmed call took effect", "dock" in str(g(saved, "structuredContent")), saved)
    return checks.summary()


async def show(params):
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write) as s:
            init = await s.initialize()
            print(f"{g(init, 'serverInfo').title}")
            for tool in (await s.list_tools()).tools:
                print(f"  tool {tool.name}")
            image = image_of(await s.call_tool("capture_image", {}))
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
