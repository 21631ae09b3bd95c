"""The Kubernetes packaging (``python -m promreflex kube build``): in step with the manifests,
every resource valid against the Kubernetes schemas (kubernetes-validate) or its Prometheus
Operator CRD (tests/fixtures/prometheus-operator, copied verbatim), kustomize builds it, the
generated rules pass ``promtool check rules``. No cluster runs here."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from jsonschema import Draft202012Validator

from promreflex import kube
from promreflex.config import REPO_ROOT
from tests.throwaway_capability import make

CRD_DIR = REPO_ROOT / "tests" / "fixtures" / "prometheus-operator"
K8S_VERSION = "1.30.0"


class _Loader(yaml.SafeLoader):
    """YAML 1.2 as Kubernetes reads it: a bare ``=`` (the CRDs' matchType enum) is a string."""


_Loader.add_constructor("tag:yaml.org,2002:value", lambda loader, node: loader.construct_scalar(node))


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for path in CRD_DIR.glob("*.yaml"):
        crd = yaml.load(path.read_text(), Loader=_Loader)  # noqa: S506 - a safe loader
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            out[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return out


def all_documents(files: dict[str, str]) -> list[dict[str, Any]]:
    return [d for name, text in files.items() if name != "kustomization.yaml" for d in yaml.safe_load_all(text)]


def problems(doc: dict[str, Any], schemas: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    key = (doc["apiVersion"], doc["kind"])
    if key in schemas:
        return [f"{doc['kind']}/{doc['metadata']['name']}: {e.json_path}: {e.message}"
                for e in Draft202012Validator(schemas[key]).iter_errors(doc)]
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{doc['kind']}/{doc['metadata']['name']}: {e}"]
    return []


def test_the_committed_files_are_in_step_with_the_manifests():
    out: list[str] = []
    assert kube.build(check=True, out=out.append) == 0, "\n".join(out)


def test_every_resource_is_valid_against_its_schema():
    docs = all_documents(kube.render())
    schemas = crd_schemas()
    assert {d["kind"] for d in docs} == {"ConfigMap", "PersistentVolumeClaim", "Deployment", "Service", "DaemonSet",
                                         "AlertmanagerConfig", "PrometheusRule", "ServiceMonitor", "PodMonitor"}
    assert [p for d in docs for p in problems(d, schemas)] == []


def test_the_schema_check_catches_broken_resources():
    docs = all_documents(kube.render())
    schemas = crd_schemas()
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    deployment["spec"]["replicas"] = "one"
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    rule["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"
    am = next(d for d in docs if d["kind"] == "AlertmanagerConfig")
    am["spec"]["receivers"][0]["webhookConfigs"][0]["httpConfig"]["authorization"]["credentials"] = "plain-token"
    assert problems(deployment, schemas) and problems(rule, schemas) and problems(am, schemas)


def test_the_central_controller_is_one_replica_and_agents_own_their_node():
    docs = all_documents(kube.render())
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "promreflex-config")
    central = yaml.safe_load(config["data"]["controller.yml"])["controller"]
    agent = yaml.safe_load(config["data"]["agent.yml"])["controller"]
    assert agent["owner"] == {"label": "node", "value_from_env": "NODE_NAME", "match_absent": True}
    assert {r["action"] for r in agent["routes"]} == {"copy-guard"}  # the default routes' host actions
    assert "copy-guard" not in {r["action"] for r in central["routes"]} and "rca" in {r["action"] for r in central["routes"]}
    # The central controller's receiver as the operator names the AlertmanagerConfig's receiver
    # in Alertmanager (<namespace>/<AlertmanagerConfig>/<receiver>); the agents, which no route
    # sends to, act on every alert of their node (the default, "promreflex", matches nothing there).
    kustomization = yaml.safe_load(kube.render()["kustomization.yaml"])
    am_config = next(d for d in docs if d["kind"] == "AlertmanagerConfig")
    receiver = am_config["spec"]["receivers"][0]["name"]
    assert am_config["spec"]["route"]["receiver"] == receiver
    assert central["alertmanager_receiver"] == f"{kustomization['namespace']}/{am_config['metadata']['name']}/{receiver}"
    assert agent["alertmanager_receiver"] is None
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    env = daemonset["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env == [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    # Both configurations load with the real model (the agent's owner reads NODE_NAME).
    from promreflex.config import ControllerConfig

    ControllerConfig.model_validate(central)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NODE_NAME", "node-1")
        ControllerConfig.model_validate(agent)


def test_the_token_comes_from_a_secret_and_no_secret_is_in_the_files():
    text = "".join(kube.render().values())
    docs = all_documents(kube.render())
    am = next(d for d in docs if d["kind"] == "AlertmanagerConfig")
    auth = am["spec"]["receivers"][0]["webhookConfigs"][0]["httpConfig"]["authorization"]
    assert auth["credentials"] == {"name": kube.TOKEN_SECRET, "key": "token"}
    assert "kind: Secret" not in text


def test_the_generated_rules_pass_promtool(tmp_path: Path):
    docs = all_documents(kube.render())
    groups = [g for d in docs if d["kind"] == "PrometheusRule" for g in d["spec"]["groups"]]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": groups}))
    r = subprocess.run(["promtool", "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_kustomization_builds(tmp_path: Path):
    """With kubectl (its built-in kustomize) when the machine has it; the kustomization's own
    shape (every file a resource, one namespace) either way."""
    assert kube.build(tmp_path, out=lambda _: None) == 0
    kustomization = yaml.safe_load((tmp_path / "kustomization.yaml").read_text())
    assert kustomization["namespace"] == "promreflex"
    assert sorted(kustomization["resources"]) == sorted(p.name for p in tmp_path.glob("*.yaml") if p.name != "kustomization.yaml")
    if shutil.which("kubectl") is None:
        return
    r = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    built = list(yaml.load_all(r.stdout, Loader=_Loader))  # noqa: S506 - a safe loader
    assert all(d["metadata"].get("namespace") == "promreflex" for d in built)
    assert len(built) == len(all_documents(kube.render()))


def test_a_new_capability_brings_its_rules_and_routes(tmp_path: Path):
    demo = make(tmp_path / "demo.rules.yml")
    docs = all_documents(kube.render([demo]))
    rules = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PrometheusRule"}
    assert [g["name"] for g in rules[f"promreflex-{demo.name}"]["spec"]["groups"]] == ["demo.alerts"]
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "promreflex-config")
    central = yaml.safe_load(config["data"]["controller.yml"])["controller"]
    assert {r["name"] for r in central["routes"]} >= {r["name"] for r in demo.routes}


def test_an_agent_as_deployed_acts_on_its_sites_alerts(monkeypatch: pytest.MonkeyPatch):
    """A stranger's review: the copy guard's alerts are per site (their rules sum over the site's
    targets: no node label survives), so agents that owned only alerts naming their node never
    paused a copy; the agent ran as uid 10001 (no write to the node's state directory, added
    capabilities not effective) without the node's network (a copy's control endpoint is on the
    node's 127.0.0.1); Alertmanager resolved the webhook's bare Service name in its own namespace."""
    from controllers.engine import bind_routes
    from promreflex.config import ControllerConfig

    docs = all_documents(kube.render())
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "promreflex-config")
    monkeypatch.setenv("NODE_NAME", "node-a")
    agent = ControllerConfig.model_validate(yaml.safe_load(config["data"]["agent.yml"])["controller"])
    (route,) = bind_routes(agent)
    alert = {"alertname": "CopyGuardSiteOverloaded", "severity": "warning", "site": "shop"}
    assert all(m.matches(alert) for m in route.matchers)
    assert all(m.matches({**alert, "node": "node-a"}) for m in route.matchers)
    assert not all(m.matches({**alert, "node": "node-b"}) for m in route.matchers)
    assert not all(m.matches({**alert, "node": "node-a2"}) for m in route.matchers)
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    assert daemonset["hostPID"] and daemonset["hostNetwork"] and daemonset["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert daemonset["securityContext"]["runAsUser"] == 0
    am_config = next(d for d in docs if d["kind"] == "AlertmanagerConfig")
    namespace = yaml.safe_load(kube.render()["kustomization.yaml"])["namespace"]
    url = am_config["spec"]["receivers"][0]["webhookConfigs"][0]["url"]
    assert url.startswith(f"http://promreflex-controller.{namespace}.svc:"), url
