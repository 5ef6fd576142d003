#!/usr/bin/env python3
"""ARP gateway client: a program's session with a robot through the signalling server.

`ArpGatewayClient` speaks ARP 0.1.0 (JSON-RPC 2.0) over the server's gateway,
`GET /v1/robots/{robotId}/arp` upgraded to a WebSocket, with a client token (the same
grant, role, control lock and record as a person). It is small enough to sit under an
LLM tool loop: `list_tools()` + `as_llm_tools()` give the model its tool definitions,
`call_tool()` runs what it picks, `ArpError` says why a call was refused.

    pip install websockets          # >= 14, the only dependency
    python3 examples/arp_gateway_client.py --server http://127.0.0.1:8080 --robot-id R --token T
    python3 examples/arp_gateway_client.py ... --drive        # a short square with `drive`
    python3 examples/arp_gateway_client.py --self-test        # offline, against a fake gateway

The token may also come from the environment variable ARP_TOKEN (a command line is
visible to every user of the machine). See docs/arp.md ("Clients of the gateway").
"""

import argparse
import asyncio
import itertools
import json
import math
import os
import sys
import urllib.parse
from datetime import datetime, timezone

import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

PROTOCOL_VERSION = "0.1.0"
CLIENT_INFO = {"name": "arp_gateway_client.py", "version": "0.1.0"}
# Requests that may wait for an answer at once (the gateway's own limit is 256).
MAX_PENDING = 256

# JSON-RPC's and ARP's error codes, for messages and for callers that branch on them.
ERROR_NAMES = {
    -32700: "Parse Error", -32600: "Invalid Request", -32601: "Method Not Found",
    -32602: "Invalid Params", -32603: "Internal Error", -40001: "Safety Violation",
    -40002: "Precondition Failed", -40003: "Tool Not Found", -40004: "Tool Busy",
    -40005: "Confirmation Timeout", -40006: "Confirmation Denied",
    -40007: "Emergency Stopped", -40008: "Context Not Found", -40009: "Not Initialized",
}


class ArpError(Exception):
    """A JSON-RPC error from the robot or the gateway, or one of this client's own.

    `reason` is `data["reason"]`: the gateway's `forbidden`, `robot_busy`, `robot_offline`,
    `rate_limited`, `session_ended` (`data["cause"]` says why); this client's `closed`,
    `timeout`, `unauthorized`, `no_grant`, `connect_failed`. A failed tool call carries
    `data = {"callId", "state": "failed", ...}`.
    """

    def __init__(self, code, message, data=None):
        super().__init__(f"{code} {ERROR_NAMES.get(code, 'Error')}: {message}")
        self.code = code
        self.message = message
        self.data = data if isinstance(data, dict) else ({} if data is None else {"value": data})

    @property
    def reason(self):
        return self.data.get("reason")

    @classmethod
    def from_error(cls, error):
        return cls(error.get("code", -32603), error.get("message", "ARP error"), error.get("data"))

    def as_tool_result(self):
        """The refusal as text for an LLM's tool result: what failed and why."""
        reason = f" [reason: {self.reason}]" if self.reason else ""
        return f"ARP error {self.code} ({ERROR_NAMES.get(self.code, 'Error')}): {self.message}{reason}"


def gateway_url(server_url, robot_id):
    """`http(s)://host[:port]` or `ws(s)://host/ws` → `ws(s)://host/v1/robots/{id}/arp`."""
    parts = urllib.parse.urlsplit(server_url)
    scheme = "wss" if parts.scheme in ("https", "wss") else "ws"
    return f"{scheme}://{parts.netloc}/v1/robots/{urllib.parse.quote(robot_id, safe='')}/arp"


def as_llm_tools(tools, style="openai"):
    """ARP tools as an LLM API's tool definitions: `openai` (function tools) or `anthropic`.

    The name and the JSON Schema of the parameters carry over as they are; the description
    gains the tool's safety level, so a model knows what needs care or a person's approval.
    """
    out = []
    for tool in tools:
        safety = tool.get("safety") or {}
        description = tool.get("description", "")
        if safety:
            note = f"Safety: {safety.get('level', 'normal')}"
            if safety.get("requiresConfirmation"):
                note += ", needs a person's confirmation"
            if safety.get("reversible") is False:
                note += ", not reversible"
            description = f"{description} ({note}.)"
        schema = tool.get("parameters") or {"type": "object", "properties": {}}
        if style == "anthropic":
            out.append({"name": tool["name"], "description": description, "input_schema": schema})
        elif style == "openai":
            out.append({"type": "function", "function": {
                "name": tool["name"], "description": description, "parameters": schema}})
        else:
            raise ValueError(f"unknown style {style!r}: openai or anthropic")
    return out


class ArpGatewayClient:
    """One ARP session with one robot through the gateway.

    One reader task routes answers to their waiters by id, progress to the call it names,
    context updates to their subscribers. `confirm`, when given, is an async function
    `(params) -> bool` asked for each of the robot's `arp.requestConfirmation`; then the
    session declares `capabilities.confirmation: true`. Without it the session does not,
    and people approve in the console.
    """

    def __init__(self, server_url, robot_id, token, *, confirm=None, confirmed_by="arp_gateway_client.py",
                 request_timeout=30.0, open_timeout=10.0):
        self.url = gateway_url(server_url, robot_id)
        self.robot_id = robot_id
        self._token = token
        self._confirm = confirm
        self._confirmed_by = confirmed_by
        self.request_timeout = request_timeout
        self.open_timeout = open_timeout
        self.server = None  # arp.initialize's result
        self.tools = []
        self._ws = None
        self._reader = None
        self._ids = itertools.count(1)
        self._pending = {}
        self._calls = []  # running calls, oldest first: {"id", "callId", "on_progress"}
        self._subscriptions = {}
        self._closed = None  # the ArpError everything fails with once the socket closed

    async def __aenter__(self):
        await self.connect()
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def connect(self, initialize=True):
        """Opens the socket (`Authorization: Bearer`) and, by default, initializes."""
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        try:
            self._ws = await websockets.connect(self.url, additional_headers=headers,
                                                open_timeout=self.open_timeout, max_size=1 << 20)
        except InvalidStatus as refused:
            status = refused.response.status_code
            reason = {401: "unauthorized", 403: "no_grant"}.get(status, "connect_failed")
            raise ArpError(-32603, f"the gateway refused the upgrade (HTTP {status})",
                           {"reason": reason, "status": status}) from None
        except (OSError, asyncio.TimeoutError) as e:
            raise ArpError(-32603, f"cannot reach {self.url}: {e}", {"reason": "connect_failed"}) from None
        self._reader = asyncio.create_task(self._read())
        if initialize:
            try:
                await self.initialize()
            except BaseException:
                await self.close()
                raise
        return self

    async def initialize(self):
        self.server = await self.request("arp.initialize", {
            "protocolVersion": PROTOCOL_VERSION,
            "clientInfo": CLIENT_INFO,
            "capabilities": {"planning": False, "confirmation": self._confirm is not None},
        })
        return self.server

    async def request(self, method, params=None, timeout="default"):
        """One JSON-RPC request; its `result`, or an ArpError."""
        if self._closed:
            raise self._closed
        if len(self._pending) >= MAX_PENDING and method != "arp.emergencyStop":
            raise ArpError(-40001, "too many requests wait for an answer", {"reason": "rate_limited"})
        request_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[request_id] = (method, future)
        try:
            await self._ws.send(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                                            "params": params or {}}))
            timeout = self.request_timeout if timeout == "default" else timeout
            return await asyncio.wait_for(future, timeout)
        except asyncio.TimeoutError:
            raise ArpError(-32603, f"no answer to {method} within {timeout} s", {"reason": "timeout"}) from None
        except ConnectionClosed:
            raise self._closed or ArpError(-32603, "the session closed", {"reason": "closed"}) from None
        finally:
            self._pending.pop(request_id, None)

    async def list_tools(self):
        self.tools = (await self.request("arp.listTools")).get("tools", [])
        return self.tools

    def as_llm_tools(self, style="openai"):
        """The tools of the last `list_tools()` as LLM tool definitions."""
        return as_llm_tools(self.tools, style)

    async def call_tool(self, name, arguments=None, on_progress=None, idempotency_key=None, timeout=None):
        """Runs a tool; returns `{"callId", "state": "completed"|"cancelled", "result"?}`.

        A failed call raises ArpError with `data["callId"]`, `data["state"] == "failed"`.
        `on_progress(params)` gets each `arp.toolProgress` of this call (a progress with a
        new callId is the oldest running call's: the robot names a call only there).
        """
        params = {"name": name, "arguments": arguments or {}}
        if idempotency_key:
            params["idempotencyKey"] = idempotency_key
        call = {"callId": None, "on_progress": on_progress}
        self._calls.append(call)
        try:
            return await self.request("arp.callTool", params, timeout=timeout)
        finally:
            self._calls.remove(call)

    async def cancel_tool(self, call_id):
        return await self.request("arp.cancelTool", {"callId": call_id})

    async def list_context(self):
        return (await self.request("arp.listContext")).get("sources", [])

    async def subscribe_context(self, name, on_update, max_rate=None):
        self._subscriptions[name] = on_update
        params = {"name": name}
        if max_rate is not None:
            params["maxRate"] = max_rate
        try:
            return await self.request("arp.subscribeContext", params)
        except ArpError:
            self._subscriptions.pop(name, None)
            raise

    async def unsubscribe_context(self, name):
        self._subscriptions.pop(name, None)
        return await self.request("arp.unsubscribeContext", {"name": name})

    async def list_constraints(self):
        return (await self.request("arp.listConstraints")).get("constraints", [])

    async def emergency_stop(self, reason="emergency stop from arp_gateway_client.py"):
        """Stops and latches the robot (anyone may); never held back by the pending limit."""
        return await self.request("arp.emergencyStop", {"reason": reason}, timeout=5)

    async def close(self):
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _read(self):
        try:
            async for text in self._ws:
                try:
                    message = json.loads(text)
                except ValueError:
                    continue
                if isinstance(message, dict):
                    await self._dispatch(message)
        except ConnectionClosed:
            pass
        finally:
            code, why = self._ws.close_code, self._ws.close_reason or ""
            self._closed = ArpError(-32603, f"the session closed ({code} {why})".strip(),
                                    {"reason": "closed", "code": code, "closeReason": why})
            for _, future in list(self._pending.values()):
                if not future.done():
                    future.set_exception(self._closed)

    async def _dispatch(self, message):
        method = message.get("method")
        if method is None:
            rid = message.get("id")
            waiting = self._pending.get(rid) if isinstance(rid, (int, str)) else None
            if waiting is None:
                if "error" in message:
                    print(f"gateway: {ArpError.from_error(message['error'])}", file=sys.stderr)
                return
            future = waiting[1]
            if future.done():
                return
            if "error" in message:
                future.set_exception(ArpError.from_error(message["error"]))
            else:
                future.set_result(message.get("result"))
        elif "id" in message:
            # Answered in its own task: a person may take a while, the reader must not wait.
            asyncio.create_task(self._robot_request(message))
        elif method == "arp.toolProgress":
            params = message.get("params", {})
            call = next((c for c in self._calls if c["callId"] == params.get("callId")), None)
            if call is None:
                call = next((c for c in self._calls if c["callId"] is None), None)
                if call is not None:
                    call["callId"] = params.get("callId")
            if call is not None and call["on_progress"]:
                call["on_progress"](params)
        elif method == "arp.contextUpdate":
            params = message.get("params", {})
            handler = self._subscriptions.get(params.get("name"))
            if handler:
                handler(params)
        elif method == "arp.emergencyStop":
            print(f"robot e-stop: {message.get('params', {}).get('reason')}", file=sys.stderr)

    async def _robot_request(self, message):
        if message["method"] != "arp.requestConfirmation":
            answer = {"error": {"code": -32601, "message": f"{message['method']} is not served here"}}
        else:
            confirmed = False
            if self._confirm is not None:
                try:
                    confirmed = bool(await self._confirm(message.get("params", {})))
                except Exception:
                    confirmed = False
            answer = {"result": {"confirmed": confirmed, "confirmedBy": self._confirmed_by,
                                 "timestamp": datetime.now(timezone.utc).isoformat()}}
        try:
            await self._ws.send(json.dumps({"jsonrpc": "2.0", "id": message["id"], **answer}))
        except ConnectionClosed:
            pass


def print_progress(params):
    print(f"    {params.get('callId')} {params.get('progress', 0):4.0%} {params.get('message', '')}")


async def drive_square(client, side=0.5, speed=0.25, turn_rate=1.0):
    """Four sides and four quarter turns with `drive`; an interruption e-stops the robot."""
    try:
        for n in range(4):
            done = await client.call_tool("drive", {"linear": speed, "angular": 0.0,
                                                    "durationSecs": side / speed}, on_progress=print_progress)
            await client.call_tool("drive", {"linear": 0.0, "angular": turn_rate,
                                             "durationSecs": (math.pi / 2) / turn_rate})
            print(f"side {n + 1}: {done['state']}")
    except (asyncio.CancelledError, KeyboardInterrupt):
        await asyncio.shield(client.emergency_stop("square interrupted"))
        raise


async def run(args):
    async with ArpGatewayClient(args.server, args.robot_id, args.token) as client:
        info = client.server["serverInfo"]
        print(f"connected to {info['name']} {info['version']} through {client.url}")
        tools = await client.list_tools()
        for tool in tools:
            print(f"  tool {tool['name']:<22} {tool['safety']['level']:<9} {tool['description']}")
        if args.llm_tools:
            print(json.dumps(client.as_llm_tools(args.llm_tools), indent=2))
        if args.drive:
            await drive_square(client, args.side, args.speed, args.turn_rate)


# ----------------------------------------------------------------------------------------
# --self-test: the client against a fake gateway on 127.0.0.1, started in this process.
# ----------------------------------------------------------------------------------------

FAKE_TOKEN = "sct_selftest"
FAKE_TOOLS = [
    {"name": "drive", "description": "Drive at a velocity for a duration",
     "parameters": {"type": "object", "required": ["linear", "angular", "durationSecs"],
                    "properties": {"linear": {"type": "number"}, "angular": {"type": "number"},
                                   "durationSecs": {"type": "number"}}},
     "safety": {"level": "elevated", "requiresConfirmation": False, "reversible": True, "description": ""}},
    {"name": "navigate_to", "description": "Go to a saved location",
     "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
     "safety": {"level": "elevated", "requiresConfirmation": True, "reversible": True, "description": ""}},
]


async def fake_gateway(connection):
    """Answers like the gateway and robot-agent would: progress, refusals, confirmation."""
    calls = itertools.count(1)
    async for text in connection:
        request = json.loads(text)
        method, rid, params = request.get("method"), request.get("id"), request.get("params", {})
        if method is None:
            continue  # the client's answer to our confirmation request, read below

        async def answer(result=None, error=None):
            body = {"error": error} if error else {"result": result}
            await connection.send(json.dumps({"jsonrpc": "2.0", "id": rid, **body}))

        if method == "arp.initialize":
            await answer({"protocolVersion": "0.1.0", "serverInfo": {"name": "fake-robot", "version": "0"},
                          "capabilities": {"tools": True, "context": True, "constraints": True,
                                           "planning": False, "confirmation": True}})
        elif method == "arp.listTools":
            await answer({"tools": FAKE_TOOLS})
        elif method == "arp.emergencyStop":
            await answer({"stopped": True})
        elif method == "arp.callTool" and params["name"] == "drive":
            if params["arguments"].get("linear", 0) > 1:
                await answer(error={"code": -40001, "message": "velocity over the limit",
                                    "data": {"constraint": "velocity_limit"}})
                continue
            call_id = f"call_{next(calls)}"
            for p in (0.0, 0.5):
                await connection.send(json.dumps({"jsonrpc": "2.0", "method": "arp.toolProgress", "params": {
                    "callId": call_id, "progress": p, "message": f"{p:.0%}", "state": "running"}}))
            await answer({"callId": call_id, "state": "completed", "result": {"elapsedSecs": 0}})
        elif method == "arp.callTool" and params["name"] == "navigate_to":
            await connection.send(json.dumps({"jsonrpc": "2.0", "id": "confirm-1", "method": "arp.requestConfirmation",
                                              "params": {"action": "navigate to dock", "safetyLevel": "elevated",
                                                         "details": {"tool": "navigate_to", "arguments": params["arguments"]},
                                                         "timeout": 5}}))
            reply = json.loads(await connection.recv())
            if reply.get("result", {}).get("confirmed"):
                await answer({"callId": "call_nav", "state": "completed"})
            else:
                await answer(error={"code": -40006, "message": "denied",
                                    "data": {"callId": "call_nav", "state": "failed",
                                             "confirmedBy": reply.get("result", {}).get("confirmedBy")}})
        elif method == "arp.callTool" and params["name"] == "hang":
            # The session ends while this call waits: as the gateway does on a revoked grant.
            await answer(error={"code": -32603, "message": "the session ended before the robot answered",
                                "data": {"reason": "session_ended", "cause": "grant_revoked"}})
            await connection.close(1000, "session ended: grant_revoked")
            return
        else:
            await answer(error={"code": -32601, "message": f"{method} not in the fake"})


def fake_upgrade(connection, request):
    """The gateway's checks before the upgrade: a token (401), a grant on the robot (403)."""
    if request.headers.get("Authorization") != f"Bearer {FAKE_TOKEN}":
        return connection.respond(401, "a client token is required\n")
    if request.path != "/v1/robots/robot-1/arp":
        return connection.respond(403, "no grant\n")
    return None


async def self_test():
    results = []

    async def check(name, body):
        try:
            await body()
            results.append((name, None))
        except Exception as e:  # report every check, fail at the end
            results.append((name, e))

    async with websockets.serve(fake_gateway, "127.0.0.1", 0, process_request=fake_upgrade) as server:
        port = server.sockets[0].getsockname()[1]
        base = f"http://127.0.0.1:{port}"

        async def refused(robot, token, reason):
            try:
                await ArpGatewayClient(base, robot, token).connect()
            except ArpError as e:
                assert e.reason == reason, e.data
            else:
                raise AssertionError("connected")

        await check("a wrong token is unauthorized", lambda: refused("robot-1", "nope", "unauthorized"))
        await check("no grant is no_grant", lambda: refused("robot-2", FAKE_TOKEN, "no_grant"))

        async def session():
            async with ArpGatewayClient(base, "robot-1", FAKE_TOKEN) as client:
                assert client.server["serverInfo"]["name"] == "fake-robot"
                tools = await client.list_tools()
                openai = client.as_llm_tools("openai")
                anthropic = client.as_llm_tools("anthropic")
                assert [t["function"]["name"] for t in openai] == ["drive", "navigate_to"]
                assert openai[0]["function"]["parameters"] == tools[0]["parameters"]
                assert anthropic[1]["input_schema"] == tools[1]["parameters"]
                assert "confirmation" in anthropic[1]["description"]
                seen = []
                done = await client.call_tool("drive", {"linear": 0.2, "angular": 0, "durationSecs": 1},
                                              on_progress=lambda p: seen.append((p["callId"], p["progress"])))
                assert done == {"callId": "call_1", "state": "completed", "result": {"elapsedSecs": 0}}, done
                assert seen == [("call_1", 0.0), ("call_1", 0.5)], seen
                try:
                    await client.call_tool("drive", {"linear": 5, "angular": 0, "durationSecs": 1})
                    raise AssertionError("not refused")
                except ArpError as e:
                    assert e.code == -40001 and e.data["constraint"] == "velocity_limit"
                    assert "Safety Violation" in e.as_tool_result()
                # No confirm callback: the client refuses on nobody's behalf.
                try:
                    await client.call_tool("navigate_to", {"location": "dock"})
                    raise AssertionError("not refused")
                except ArpError as e:
                    assert e.code == -40006 and e.data["callId"] == "call_nav"
                await drive_square(client, side=0.1, speed=0.1, turn_rate=math.pi)
                assert (await client.emergency_stop("self-test")) == {"stopped": True}
                try:
                    await client.call_tool("hang")
                    raise AssertionError("not ended")
                except ArpError as e:
                    assert e.reason == "session_ended" and e.data["cause"] == "grant_revoked", e.data
                await asyncio.wait_for(client._reader, 5)
                try:
                    await client.list_tools()
                    raise AssertionError("still open")
                except ArpError as e:
                    assert e.reason == "closed" and e.data["code"] == 1000, e.data

        await check("a session: tools, LLM definitions, progress, refusals, square, e-stop, end", session)

        async def confirmed():
            async def yes(params):
                assert params["details"]["tool"] == "navigate_to"
                return True
            async with ArpGatewayClient(base, "robot-1", FAKE_TOKEN, confirm=yes) as client:
                assert (await client.call_tool("navigate_to", {"location": "dock"}))["state"] == "completed"

        await check("a confirm callback approves", confirmed)

    failed = [(n, e) for n, e in results if e is not None]
    for name, error in results:
        print(f"{'ok' if error is None else 'FAIL'}  {name}" + (f": {error!r}" if error else ""))
    print(f"self-test: {len(results) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", help="the signalling server, http(s)://HOST:PORT")
    parser.add_argument("--robot-id", help="the robot to connect to")
    parser.add_argument("--token", default=os.environ.get("ARP_TOKEN"),
                        help="a client token (default: $ARP_TOKEN)")
    parser.add_argument("--drive", action="store_true", help="drive a short square with `drive`")
    parser.add_argument("--side", type=float, default=0.5, help="side of the square, m")
    parser.add_argument("--speed", type=float, default=0.25, help="m/s")
    parser.add_argument("--turn-rate", type=float, default=1.0, help="rad/s")
    parser.add_argument("--llm-tools", choices=["openai", "anthropic"],
                        help="also print the tools as this API's tool definitions")
    parser.add_argument("--self-test", action="store_true",
                        help="run against a fake gateway on 127.0.0.1 (no network) and exit")
    args = parser.parse_args()
    if args.self_test:
        return asyncio.run(self_test())
    if not (args.server and args.robot_id and args.token):
        parser.error("--server, --robot-id and --token (or ARP_TOKEN) are required")
    try:
        asyncio.run(run(args))
    except ArpError as e:
        print(f"error: {e} {json.dumps(e.data)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
