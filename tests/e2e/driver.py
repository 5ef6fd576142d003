#!/usr/bin/env python3
"""Recording exec driver for the end-to-end test.

Speaks the robot-agent exec protocol (JSON-RPC 2.0, one object per line):
announces itself with a `ready` notification, records every message it
receives as a JSON line (with a receive time) in the file named by argv[1],
accepts navigation goals and reports them completed shortly after.
"""

import json
import sys
import threading
import time

LOG = open(sys.argv[1], "a", buffering=1)
OUT_LOCK = threading.Lock()
NAV_SECONDS = 0.3


def send(message):
    with OUT_LOCK:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


def finish(name, token):
    # Only the goal that is still current completes.
    if CURRENT.get("token") == token:
        CURRENT.clear()
        send({"jsonrpc": "2.0", "method": "navigation_status",
              "params": {"name": name, "status": "completed"}})


CURRENT = {}

send({"jsonrpc": "2.0", "method": "ready", "params": {"driver": "e2e-recorder"}})
for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    try:
        message = json.loads(line)
    except ValueError:
        continue
    message["t"] = time.time()
    LOG.write(json.dumps(message) + "\n")
    method = message.get("method")
    if method == "navigate":
        token = object()
        CURRENT["token"] = token
        send({"jsonrpc": "2.0", "id": message["id"], "result": {}})
        threading.Timer(NAV_SECONDS, finish, args=(message["params"]["name"], token)).start()
    elif method == "cancel_navigation":
        CURRENT.clear()
        send({"jsonrpc": "2.0", "id": message["id"], "result": {}})
    elif method == "stop":
        CURRENT.clear()
