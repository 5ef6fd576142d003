#!/usr/bin/env python3
"""Checks deploy/ as far as a machine without a container engine allows.

- docker-compose.yml: parses; two signalling nodes on one PostgreSQL and one Redis behind
  HAProxy, coturn, Prometheus and Grafana; every service has a healthcheck.
- kubernetes/: every manifest validates against the Kubernetes OpenAPI schemas
  (kubernetes-validate, from PyPI), plus the rules of issue 14 (replicas, probes, preStop,
  non-root, read-only root filesystem, PDB).
- prometheus/ and grafana/: every signalling_* metric they name is one the server exports
  (src/metrics.rs), so a renamed metric cannot silently blank a panel or an alert.
(HAProxy's and promtool's own checks run from tests/cluster/run.sh.)
"""
import glob
import json
import os
import re
import subprocess
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
KUBERNETES_VERSION = os.environ.get("KUBERNETES_VERSION", "1.30.0")
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)


def compose():
    with open(os.path.join(DEPLOY, "docker-compose.yml")) as f:
        doc = yaml.safe_load(f)
    services = doc["services"]
    for name in ["postgres", "redis", "node1", "node2", "haproxy", "coturn", "prometheus", "grafana"]:
        check(name in services, f"compose: service {name} missing")
    for name, service in services.items():
        check("healthcheck" in service, f"compose: {name} has no healthcheck")
    for node in ["node1", "node2"]:
        env = services[node]["environment"]
        check(env.get("REDIS_URL", "").startswith("redis://"), f"compose: {node} without REDIS_URL")
        check(env.get("DATABASE_URL", "").startswith("postgres://"), f"compose: {node} without PostgreSQL")
        check(env.get("SIGNALLING_NODE_ID") == node, f"compose: {node} needs its own node id")
        check(services[node].get("read_only") is True, f"compose: {node} root fs not read-only")
    volumes = services["haproxy"].get("volumes", [])
    check(any("haproxy/haproxy.cfg" in v for v in volumes), "compose: HAProxy must use deploy/haproxy/haproxy.cfg")


def kubernetes():
    files = sorted(f for f in glob.glob(os.path.join(DEPLOY, "kubernetes", "*.yaml"))
                   if not f.endswith("kustomization.yaml"))
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", KUBERNETES_VERSION, *files],
        capture_output=True, text=True)
    print(result.stdout, end="")
    check(result.returncode == 0, f"kubernetes-validate failed:\n{result.stdout}{result.stderr}")
    docs = {}
    for path in files:
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                docs[doc["kind"]] = doc
    with open(os.path.join(DEPLOY, "kubernetes", "kustomization.yaml")) as f:
        listed = yaml.safe_load(f)["resources"]
    check(sorted(listed) == sorted(os.path.basename(f) for f in files),
          "kustomization.yaml must list every manifest")
    for kind in ["Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "Secret"]:
        check(kind in docs, f"kubernetes: no {kind}")
    deployment = docs["Deployment"]["spec"]
    check(deployment["replicas"] >= 2, "kubernetes: fewer than 2 replicas")
    pod = deployment["template"]["spec"]
    check(pod["securityContext"].get("runAsNonRoot") is True, "kubernetes: must run as non-root")
    container = pod["containers"][0]
    check(container["securityContext"].get("readOnlyRootFilesystem") is True,
          "kubernetes: root filesystem must be read-only")
    check(container["readinessProbe"]["httpGet"]["path"] == "/readyz", "kubernetes: readiness on /readyz")
    check(container["livenessProbe"]["httpGet"]["path"] == "/healthz", "kubernetes: liveness on /healthz")
    check("preStop" in container.get("lifecycle", {}), "kubernetes: preStop hook missing")


def exported_metrics():
    with open(os.path.join(ROOT, "src", "metrics.rs")) as f:
        return set(re.findall(r'"(signalling_[a-z_]+)"', f.read()))


def used_metrics(text):
    names = set(re.findall(r"\b(signalling_[a-z_]+)", text))
    # Histogram series carry suffixes on top of the registered name.
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in names}


def observability():
    exported = exported_metrics()
    check(len(exported) > 5, "could not read the metric names from src/metrics.rs")
    with open(os.path.join(DEPLOY, "prometheus", "alerts.yml")) as f:
        alerts_text = f.read()
    alerts = yaml.safe_load(alerts_text)
    names = {r["alert"] for g in alerts["groups"] for r in g["rules"]}
    for wanted in ["SignallingNodeDown", "SignallingPkiFailureSpike", "SignallingBusLag", "SignallingCrlStale"]:
        check(wanted in names, f"alerts: {wanted} missing")
    for name in used_metrics(alerts_text) - exported:
        failures.append(f"alerts.yml names {name}, which the server does not export")
    with open(os.path.join(DEPLOY, "grafana", "dashboards", "signalling.json")) as f:
        dashboard_text = f.read()
    dashboard = json.loads(dashboard_text)
    check(len(dashboard["panels"]) >= 6, "dashboard: too few panels")
    for panel in dashboard["panels"]:
        check(panel.get("targets"), f"dashboard: panel {panel.get('title')} has no query")
    for name in used_metrics(dashboard_text) - exported:
        failures.append(f"dashboard names {name}, which the server does not export")
    for wanted in ["signalling_connections", "signalling_robots_online", "signalling_sessions_active",
                   "signalling_relay_latency_seconds", "signalling_pki_results_total",
                   "signalling_cluster_bus_lag_seconds"]:
        check(wanted in used_metrics(dashboard_text), f"dashboard: no panel uses {wanted}")


compose()
kubernetes()
observability()
if failures:
    print("deploy/ validation failed:")
    for failure in failures:
        print(" -", failure)
    sys.exit(1)
print("deploy/ validation: compose, kubernetes, alerts and dashboard OK")
