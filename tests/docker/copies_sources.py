#!/usr/bin/env python3
"""The static step's check that the Dockerfile's build stage copies the sources of every
workspace member the server is built from (`cargo metadata` on stdin; the Dockerfile's path
as argument). Manifests alone resolve the workspace, but the server would then be built
against a member's empty stub (seen when the server came to depend on arp-bridge)."""
import json, re, sys
meta = json.load(sys.stdin)
members = {p["id"]: p for p in meta["packages"] if p["id"] in meta["workspace_members"]}
deps = {
    n["id"]: [d["pkg"] for d in n["deps"]
              if any(k["kind"] in (None, "build") for k in d["dep_kinds"])]
    for n in meta["resolve"]["nodes"]
}
root = next(i for i, p in members.items() if p["name"] == "signalling-server")
need, todo = set(), [root]
while todo:
    for dep in deps[todo.pop()]:
        if dep in members and dep not in need:
            need.add(dep)
            todo.append(dep)
dockerfile = open(sys.argv[1]).read()
prefix = meta["workspace_root"] + "/"
missing = []
for member in sorted(need):
    folder = members[member]["manifest_path"][len(prefix):].rsplit("/", 1)[0]
    if not re.search(r"^COPY %s \./%s$" % (re.escape(folder), re.escape(folder)), dockerfile, re.M):
        missing.append(folder)
if missing:
    sys.exit("Dockerfile: the server is built from the sources of %s: copy them in the build stage"
             % ", ".join(missing))
