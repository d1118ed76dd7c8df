"""Helm charts, alert rules and the dashboard, checked with real tools:
helm (lint, template), the Kubernetes schemas (npm kubernetes-models),
promtool (check and unit-test rules), and a real Prometheus scraping thaw."""

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import threading
import urllib.parse
import urllib.request

import pytest
import yaml

from conftest import ROOT, THAW_BIN, free_port, wait_for
from test_kubernetes import KUBECTL, cluster, pki, start_thaw  # noqa: F401  (fixtures)
from test_process import complete, sim_model
from test_tenants import model, tenant

HELM = os.environ.get("HELM") or os.path.join(ROOT, ".tools", "bin", "helm")
if not os.path.exists(HELM):
    HELM = shutil.which("helm") or HELM
CHARTS = os.path.join(ROOT, "charts")
CHECKS = os.path.join(ROOT, "tests", "charts")
ALL_ON = ["priorityClasses.create=true", "devicePlugin.enabled=true",
          "metrics.serviceMonitor.enabled=true", "metrics.prometheusRule.enabled=true",
          "metrics.grafanaDashboard.enabled=true", "networkPolicy.enabled=true",
          "networkPolicy.adminFrom[0].namespaceSelector.matchLabels.team=monitoring"]
# Each weights-cache, download and pre-pull option of the model chart.
HF = "meta-llama/Llama-3.1-8B-Instruct"
MODEL_OPTIONS = {
    "hostPath+initContainer": ["server.cache.type=hostPath", "server.download.mode=initContainer",
                               f"server.download.model={HF}", "server.cache.offline=true"],
    "pvc+job": ["server.cache.type=pvc", "server.cache.pvc=weights",
                "server.download.mode=job", f"server.download.model={HF}",
                "server.download.tokenSecret=hf-token"],
    "sharedPvc+job": ["server.cache.type=sharedPvc", "server.cache.shared.storageClassName=nfs",
                      "server.download.mode=job", f"server.download.model={HF}"],
    "sharedPvc-ROX-snapshot": ["server.cache.type=sharedPvc",
                               "server.cache.shared.accessMode=ReadOnlyMany",
                               "server.cache.shared.dataSource.kind=VolumeSnapshot",
                               "server.cache.shared.dataSource.name=llama-weights",
                               "server.cache.shared.dataSource.apiGroup=snapshot.storage.k8s.io",
                               "server.cache.offline=true"],
    "prepull": ["prepull.enabled=true", "nodeSelector.pool=gpu-a100"],
    "sleep": ["sleep.enabled=true", "sleep.level=2", "sleep.idleBeforeSleep=5m"],
}
DOCS = os.path.join(ROOT, "docs")
TENANTS = ["config.tenants.source.kind=secret", "config.tenants.source.name=thaw-tenants"]
DCGM = {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_POWER_MGMT_LIMIT"}

needs_helm = pytest.mark.skipif(not os.path.exists(HELM),
                                reason="helm not installed (scripts/setup.sh test installs it)")


def helm(*args, check=True):
    r = subprocess.run([HELM, *args], capture_output=True, text=True, timeout=60)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def render(chart, *sets, namespace="thaw-system", values=None):
    args = ["template", "rel", os.path.join(CHARTS, chart), "--namespace", namespace]
    if values:
        args += ["--values", values]
    for s in sets:
        args += ["--set", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def by_kind(objs, kind):
    return [o for o in objs if o["kind"] == kind]


@needs_helm
@pytest.mark.parametrize("chart", ["thaw", "thaw-model"])
def test_helm_lint_strict(chart):
    out = helm("lint", "--strict", os.path.join(CHARTS, chart)).stdout
    assert "0 chart(s) failed" in out


@needs_helm
def test_rendered_objects_are_valid_kubernetes():
    if not os.path.isdir(os.path.join(CHECKS, "node_modules")):
        pytest.skip("npm packages not installed (scripts/setup.sh test installs them)")
    objs = (render("thaw") + render("thaw", *ALL_ON, "watchNamespaces[0]=models")
            + render("thaw", "watchNamespaces[0]=models", "replicaCount=1", *TENANTS)
            + render("thaw-model", namespace="models")
            + render("thaw-model", "thawAnnotations.max-scale=3",
                     "thawAnnotations.fallback-to-warm-revision=true", namespace="models")
            + render("thaw-model", "server.kind=llamacpp", "priorityClassName=thaw-batch",
                     namespace="models")
            + [o for sets in MODEL_OPTIONS.values()
               for o in render("thaw-model", *sets, namespace="models")])
    r = subprocess.run(["node", "validate.mjs"], input=json.dumps(objs), capture_output=True,
                       text=True, cwd=CHECKS, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("ok ") == len(objs)


@needs_helm
@pytest.mark.parametrize("chart,bad", [
    ("thaw", "replicaCount=two"),
    ("thaw", "image.pullPolicy=Sometimes"),
    ("thaw", "devicePlugin.mode=mig"),
    ("thaw", "priorityClasses.batch.preemptionPolicy=Always"),
    ("thaw", "metrics.prometheusRule.coldStartSlowSeconds=1800"),  # past the last bucket
    # thaw refuses to start on any other kind
    ("thaw", ("config.tenants.source.kind=vault", "config.tenants.source.name=t")),
    ("thaw", ("config.tenants.source.kind=Secret", "config.tenants.source.name=t")),
    ("thaw", ("config.tenants.source.name=t",)),
    ("thaw-model", "server.kind=tgi"),
    ("thaw-model", "thawAnnotations.priority=urgent"),
    ("thaw-model", "name=Not_A_DNS_Name"),
    ("thaw-model", "server.cache.type=nfs"),
    ("thaw-model", "server.download.mode=always"),
    ("thaw-model", "server.cache.shared.accessMode=ReadWriteOnce"),
    ("thaw-model", "sleep.level=3"),
])
def test_values_schema_rejects_bad_values(chart, bad):
    args = ["template", "rel", os.path.join(CHARTS, chart)]
    for x in ([bad] if isinstance(bad, str) else bad):
        args += ["--set", x]
    r = helm(*args, check=False)
    assert r.returncode != 0 and "values don't meet the specifications" in r.stderr


@needs_helm
def test_rendered_thaw_config_is_valid(tmp_path):
    cm = next(o for o in render("thaw", "watchNamespaces[0]=models") if o["kind"] == "ConfigMap")
    cfg = json.loads(cm["data"]["config.json"])
    assert cfg["kubernetes"]["leader_election"] and cfg["kubernetes"]["peers_service"] == "rel-admin"
    (tmp_path / "c.json").write_text(cm["data"]["config.json"])
    r = subprocess.run([THAW_BIN, "--check-config", str(tmp_path / "c.json")], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


def rules_of(objs):
    out = set()
    for o in objs:
        if o["kind"] in ("Role", "ClusterRole"):
            for r in o["rules"]:
                for g in r["apiGroups"]:
                    for res in r["resources"]:
                        out.add((o["kind"], g, res, tuple(sorted(r["verbs"]))))
    return out


@needs_helm
def test_rbac_is_exactly_what_the_docs_list():
    docs = {("apps", "deployments", ("get", "list", "patch", "watch")),
            ("apps", "deployments/scale", ("patch",)),
            ("", "pods", ("delete", "get", "list", "patch", "watch")),
            ("discovery.k8s.io", "endpointslices", ("get", "list", "watch")),
            ("", "events", ("create", "list", "patch", "watch"))}
    everywhere = rules_of(render("thaw"))
    assert {(g, r, v) for k, g, r, v in everywhere if k == "ClusterRole"} == docs | {
        ("", "nodes", ("get", "list", "watch"))}
    scoped = rules_of(render("thaw", "watchNamespaces[0]=models", "watchNamespaces[1]=b"))
    # Namespaced: Roles for models; only nodes stay cluster-wide.
    assert {(g, r, v) for k, g, r, v in scoped if k == "ClusterRole"} == {
        ("", "nodes", ("get", "list", "watch"))}
    assert ("Role", "coordination.k8s.io", "leases", ("create", "get", "update")) in scoped
    for _, _, res, verbs in everywhere | scoped:
        assert "*" not in verbs and res != "secrets"


@needs_helm
def test_a_tenants_source_gets_read_access_to_that_object_only():
    objs = render("thaw", "config.tenants.required=true", "config.tenants.source.kind=secret",
                  "config.tenants.source.name=thaw-tenants")
    roles = [o for o in by_kind(objs, "Role") if o["metadata"]["name"].endswith("-tenants")]
    assert len(roles) == 1 and roles[0]["metadata"]["namespace"] == "thaw-system"
    assert roles[0]["rules"] == [{"apiGroups": [""], "resources": ["secrets"],
                                  "resourceNames": ["thaw-tenants"],
                                  "verbs": ["get", "list", "watch"]}]
    binding = next(o for o in by_kind(objs, "RoleBinding")
                   if o["metadata"]["name"].endswith("-tenants"))
    assert binding["roleRef"]["name"] == roles[0]["metadata"]["name"]
    cm = json.loads(next(o for o in by_kind(objs, "ConfigMap")
                         if o["data"].get("config.json"))["data"]["config.json"])
    assert cm["tenants"]["source"] == {"kind": "secret", "name": "thaw-tenants"}
    other = render("thaw", "config.tenants.source.kind=configmap",
                   "config.tenants.source.name=t", "config.tenants.source.namespace=auth")
    role = next(o for o in by_kind(other, "Role") if o["metadata"]["name"].endswith("-tenants"))
    assert role["metadata"]["namespace"] == "auth"
    assert role["rules"][0]["resources"] == ["configmaps"]
    # Without a source: no access to any Secret or ConfigMap.
    for _, _, res, _ in rules_of(render("thaw")):
        assert res not in ("secrets", "configmaps")


def grants(objs, sa="rel", sa_ns="thaw-system"):
    """What the release's ServiceAccount may do, following its bindings as the API server's
    RBAC authorizer does: {(namespace, or "*" cluster-wide; group; resource; verb;
    resource name, or "*")}."""
    roles = {(o["kind"], o["metadata"].get("namespace") if o["kind"] == "Role" else None,
              o["metadata"]["name"]): o for o in objs if o["kind"] in ("Role", "ClusterRole")}
    out = set()
    for b in objs:
        if b["kind"] not in ("RoleBinding", "ClusterRoleBinding") or not any(
                s["kind"] == "ServiceAccount" and s["name"] == sa and s.get("namespace") == sa_ns
                for s in b["subjects"]):
            continue
        ns = b["metadata"]["namespace"] if b["kind"] == "RoleBinding" else "*"
        ref = b["roleRef"]
        role = roles.get((ref["kind"], ns if ref["kind"] == "Role" else None, ref["name"]))
        assert role, f"{b['kind']} {b['metadata']['name']} binds a role that is not rendered"
        for r in role["rules"]:
            for g in r["apiGroups"]:
                for res in r["resources"]:
                    for v in r["verbs"]:
                        for n in r.get("resourceNames") or ["*"]:
                            out.add((ns, g, res, v, n))
    return out


def allowed(g, verb, resource, ns, group="", name="*"):
    return any(gns in ("*", ns) and gg == group and res == resource and v == verb and
               n in ("*", name) for gns, gg, res, v, n in g)


@needs_helm
@pytest.mark.parametrize("sets", [
    [],                                                   # two activators: a leader Role too
    ["replicaCount=1", "leaderElection.enabled=false"],   # one: no leader Role
])
def test_invalid_tenants_events_may_be_posted_where_the_tenants_object_is(sets):
    """thaw posts the Warning Event InvalidTenants on the tenants Secret, in its namespace
    (thaw's own by default): with watchNamespaces, the model Roles grant Events only in the
    watched namespaces, and the API server answered 403."""
    scoped = ["watchNamespaces[0]=models", *sets]
    g = grants(render("thaw", *scoped, *TENANTS))
    for verb in ("create", "patch"):
        assert allowed(g, verb, "events", "thaw-system"), verb
        assert allowed(g, verb, "events", "models"), verb
    # Nothing more: no Events elsewhere, none read in thaw's own namespace.
    assert not allowed(g, "create", "events", "default")
    assert not allowed(g, "list", "events", "thaw-system")
    assert not allowed(g, "watch", "events", "thaw-system")
    assert allowed(g, "get", "secrets", "thaw-system", name="thaw-tenants")
    assert not allowed(g, "get", "secrets", "thaw-system", name="other")
    # A Secret in another namespace: the Events go there.
    g = grants(render("thaw", *scoped, *TENANTS, "config.tenants.source.namespace=auth"))
    assert allowed(g, "create", "events", "auth") and allowed(g, "patch", "events", "auth")
    assert not allowed(g, "create", "events", "thaw-system")
    # No source: no Events in thaw's own namespace.
    assert not allowed(grants(render("thaw", *scoped)), "create", "events", "thaw-system")
    # A watched namespace already has them: the tenants Role grants only the Secret.
    objs = render("thaw", *scoped, "watchNamespaces[1]=thaw-system", *TENANTS)
    assert allowed(grants(objs), "create", "events", "thaw-system")
    role = next(o for o in by_kind(objs, "Role") if o["metadata"]["name"].endswith("-tenants"))
    assert [r["resources"] for r in role["rules"]] == [["secrets"]]
    # So does the ClusterRole when thaw watches every namespace.
    objs = render("thaw", *sets, *TENANTS)
    assert allowed(grants(objs), "create", "events", "thaw-system")
    role = next(o for o in by_kind(objs, "Role") if o["metadata"]["name"].endswith("-tenants"))
    assert [r["resources"] for r in role["rules"]] == [["secrets"]]
    # docs/kubernetes.md's RBAC section lists it.
    rbac = open(os.path.join(DOCS, "kubernetes.md")).read().split("## RBAC", 1)[1]
    rbac = rbac.split("\n## ", 1)[0]
    assert any(row.startswith('| `""` | `events` | create, patch |') and "InvalidTenants" in row
               for row in rbac.splitlines()), "kubernetes.md's RBAC table"


def test_deploy_md_shows_the_invalid_tenants_event_with_a_command_that_shows_it(
        cluster, thaw_factory, tmp_path, upstream):  # noqa: F811
    """deploy.md's command for the InvalidTenants Event, run with the real kubectl against
    the API simulator after thaw rejected a Secret, prints it (`kubectl describe secret`,
    which it said, has no Events section)."""
    if not os.path.exists(KUBECTL):
        pytest.skip("kubectl not installed (scripts/setup.sh installs it)")
    doc = open(os.path.join(DOCS, "deploy.md")).read()
    section = doc[doc.index("### Tenants from a Secret"):doc.index("## 4. ")]
    text = " ".join(section.split())
    at = text.index("`InvalidTenants`", text.index("A version that does not read"))
    near = text[at - 300:at + 300]
    # The commands it says show the Event (not one it says shows none).
    cmds = [m.group(1) for m in re.finditer(r"`(kubectl [^`]+)`(?! shows no Events)", near)
            if " events" in m.group(1) or "describe" in m.group(1)]
    assert cmds, "deploy.md names no command that shows the Event"
    sim = cluster()
    ns = "thaw-system"  # the docs' namespace: thaw's own, where the Secret lives
    sim.call("POST", f"/api/v1/namespaces/{ns}/secrets", {
        "metadata": {"name": "thaw-tenants", "namespace": ns},
        "data": {"tenants.json": base64.b64encode(json.dumps(
            {"required": True, "list": [tenant("big", tier="urgent")]}).encode()).decode()}})
    t = start_thaw(thaw_factory, sim, tmp_path, kc={"namespace": ns}, extra={
        "tenants": {"required": True, "source": {"kind": "secret", "name": "thaw-tenants"}},
        "models": [model(upstream)]})
    wait_for(lambda: any(e.get("reason") == "InvalidTenants"
                         for e in sim.call("GET", f"/api/v1/namespaces/{ns}/events")[1]["items"]),
             what="thaw's InvalidTenants Event")
    assert t.status()["kubernetes"]["tenants_source"]["state"] == "error"
    kc = sim.kubeconfig(str(tmp_path / "kubectl-config"), namespace=ns)
    for c in cmds:
        argv = shlex.split(c)[1:]
        # The simulator serves no server-side tables (a cluster's REASON and MESSAGE
        # columns): what `get` selects is read as JSON instead.
        listing = "get" in argv
        r = subprocess.run([KUBECTL, "--kubeconfig", kc, *argv, *(["-o", "json"] * listing)],
                           capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, (c, r.stderr)
        if listing:
            events = json.loads(r.stdout)["items"]
            assert events and all(e["involvedObject"]["name"] == "thaw-tenants"
                                  for e in events), (c, events)
            shown = [(e["type"], e["reason"], e["message"]) for e in events]
        else:
            shown = r.stdout
        assert "InvalidTenants" in str(shown) and "tenants.list[0].tier" in str(shown), (c, shown)
    # What it said before: kubectl describes a Secret without its Events.
    r = subprocess.run([KUBECTL, "--kubeconfig", kc, "describe", "secret", "thaw-tenants"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "thaw-tenants" in r.stdout and "InvalidTenants" not in r.stdout


@needs_helm
def test_two_releases_of_one_name_in_two_namespaces_do_not_collide():
    """Cluster-wide objects, and the Roles a release puts in the namespaces it
    watches, carry the release's namespace: a second thaw called thaw (a staging
    copy) does not overwrite the first one's grants."""
    a = render("thaw", "watchNamespaces={models}", namespace="team-a")
    b = render("thaw", "watchNamespaces={models}", namespace="team-b")
    names = lambda objs: {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"])
                          for o in objs if o["kind"] in ("ClusterRole", "ClusterRoleBinding",
                                                         "Role", "RoleBinding")
                          and o["metadata"].get("namespace") not in ("team-a", "team-b")}
    assert names(a) and not names(a) & names(b), names(a) & names(b)
    a = render("thaw", namespace="team-a")
    b = render("thaw", namespace="team-b")
    assert names(a) and not names(a) & names(b), names(a) & names(b)


def test_pod_security_and_lifecycle():
    objs = render("thaw")
    d = by_kind(objs, "Deployment")[0]
    spec = d["spec"]["template"]["spec"]
    c = spec["containers"][0]
    assert d["spec"]["replicas"] == 2
    assert spec["securityContext"]["runAsNonRoot"] and \
        spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    cfg = json.loads(by_kind(objs, "ConfigMap")[0]["data"]["config.json"])
    assert spec["terminationGracePeriodSeconds"] * 1000 > cfg["limits"]["drain_timeout_ms"]
    assert "podAntiAffinity" in spec["affinity"]
    assert by_kind(objs, "PodDisruptionBudget")
    env = {e["name"] for e in c["env"]}
    assert {"POD_NAME", "POD_IP"} <= env


@needs_helm
@pytest.mark.parametrize("sets,minimum", [
    (["config.limits.drain_timeout_ms=60000"], 61),    # the default grace (45 s) is short
    (["terminationGracePeriodSeconds=20"], 31),        # under the default drain (30 s)
    (["terminationGracePeriodSeconds=30"], 31),        # equal: SIGKILL as the drain ends
    # Not set: thaw's own default drain timeout, 30 s (docs/configuration.md).
    (["config.limits.drain_timeout_ms=null", "terminationGracePeriodSeconds=30"], 31),
    (["config.limits.drain_timeout_ms=90500", "terminationGracePeriodSeconds=90"], 91),
])
def test_a_grace_period_not_above_the_drain_timeout_fails_the_render(sets, minimum):
    """The kubelet SIGKILLs the activator at the end of the grace period: one not above the
    drain timeout cuts the requests the drain was letting finish."""
    args = ["template", "rel", os.path.join(CHARTS, "thaw")]
    for x in sets:
        args += ["--set", x]
    r = helm(*args, check=False)
    assert r.returncode != 0, r.stdout[:200]
    assert "must exceed config.limits.drain_timeout_ms" in r.stderr, r.stderr
    assert f"at least {minimum}" in r.stderr, r.stderr
    # The smallest grace that is enough renders.
    ok = render("thaw", *[x for x in sets if not x.startswith("terminationGrace")],
                f"terminationGracePeriodSeconds={minimum}")
    spec = deployment_pod(ok)
    cfg = json.loads(by_kind(ok, "ConfigMap")[0]["data"]["config.json"])
    assert spec["terminationGracePeriodSeconds"] * 1000 > cfg["limits"].get(
        "drain_timeout_ms", 30000)


@needs_helm
def test_pod_disruption_budget_only_when_a_disruption_can_satisfy_it():
    """minAvailable 1 over one activator lets no eviction through: every node drain
    would block on it."""
    assert not by_kind(render("thaw", "replicaCount=1"), "PodDisruptionBudget")
    assert not by_kind(render("thaw", "replicaCount=1", "leaderElection.enabled=false"),
                       "PodDisruptionBudget")
    for n in (2, 3):
        objs = render("thaw", f"replicaCount={n}")
        pdb = by_kind(objs, "PodDisruptionBudget")
        assert len(pdb) == 1 and pdb[0]["spec"]["minAvailable"] == 1
        assert pdb[0]["spec"]["selector"]["matchLabels"] == \
            by_kind(objs, "Deployment")[0]["spec"]["selector"]["matchLabels"]
    assert not by_kind(render("thaw", "podDisruptionBudget.enabled=false"),
                       "PodDisruptionBudget")


@needs_helm
def test_numeric_and_boolean_annotations_render_as_strings(tmp_path):
    """--set thawAnnotations.max-scale=3 works as --set-string does (the schema refused
    the integer), and whole numbers from a values file (floats to Helm) keep their digits."""
    anns = by_kind(render("thaw-model", "thawAnnotations.max-scale=3",
                          "thawAnnotations.min-scale=0",
                          "thawAnnotations.panic-window-percentage=12.5",
                          "thawAnnotations.fallback-to-warm-revision=true"),
                   "Deployment")[0]["metadata"]["annotations"]
    assert anns["thaw.dev/max-scale"] == "3" and anns["thaw.dev/min-scale"] == "0"
    assert anns["thaw.dev/panic-window-percentage"] == "12.5"
    assert anns["thaw.dev/fallback-to-warm-revision"] == "true"
    (tmp_path / "v.yaml").write_text(yaml.safe_dump({"thawAnnotations": {
        "max-scale": 4, "target": 1000000, "gpu-memory": 21474836480, "rollout": True}}))
    anns = by_kind(render("thaw-model", values=str(tmp_path / "v.yaml")),
                   "Deployment")[0]["metadata"]["annotations"]
    assert anns["thaw.dev/max-scale"] == "4" and anns["thaw.dev/target"] == "1000000"
    assert anns["thaw.dev/gpu-memory"] == "21474836480" and anns["thaw.dev/rollout"] == "true"
    assert all(isinstance(v, str) for v in anns.values())
    # priority stays one of the three tiers
    r = helm("template", "rel", os.path.join(CHARTS, "thaw-model"), "--set",
             "thawAnnotations.priority=1", check=False)
    assert r.returncode != 0 and "values don't meet the specifications" in r.stderr


@needs_helm
def test_optional_parts():
    objs = render("thaw", *ALL_ON)
    pcs = {o["metadata"]["name"]: o for o in by_kind(objs, "PriorityClass")}
    assert pcs["thaw-critical"]["value"] > pcs["thaw-standard"]["value"] > pcs["thaw-batch"]["value"]
    assert pcs["thaw-batch"]["preemptionPolicy"] == "Never"
    dp = next(o for o in by_kind(objs, "ConfigMap") if o["metadata"]["name"].endswith("device-plugin"))
    conf = yaml.safe_load(dp["data"]["config.yaml"])
    assert conf["version"] == "v1"
    assert conf["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    assert conf["sharing"]["timeSlicing"]["failRequestsGreaterThanOne"] is True
    assert conf["sharing"]["timeSlicing"]["renameByDefault"] is False
    assert conf["flags"]["migStrategy"] == "none"

    def plugin_config(*sets, namespace="thaw-system"):
        cm = next(o for o in by_kind(render("thaw", "devicePlugin.enabled=true", *sets),
                                     "ConfigMap") if o["metadata"]["name"].endswith("device-plugin"))
        assert cm["metadata"]["namespace"] == namespace
        return yaml.safe_load(cm["data"]["config.yaml"])
    mps = plugin_config("devicePlugin.mode=mps", "devicePlugin.renameByDefault=true")
    assert mps["sharing"]["mps"]["resources"][0]["replicas"] == 4
    assert mps["sharing"]["mps"]["renameByDefault"] is True
    assert "failRequestsGreaterThanOne" not in mps["sharing"]["mps"]
    mig = plugin_config("devicePlugin.mode=none", "devicePlugin.migStrategy=mixed",
                        "devicePlugin.namespace=gpu-operator", namespace="gpu-operator")
    assert mig == {"version": "v1", "flags": {"migStrategy": "mixed"}}
    assert by_kind(objs, "ServiceMonitor")[0]["spec"]["endpoints"][0]["port"] == "admin"
    rule = by_kind(objs, "PrometheusRule")[0]
    names = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"ThawQueueRejections", "ThawColdStartSlow", "ThawKubernetesAPIUnreachable",
            "GPUUtilizationHigh", "GPUFramebufferNearlyFull", "GPUPowerAtLimit"} <= names
    dash = next(o for o in by_kind(objs, "ConfigMap") if o["metadata"]["name"].endswith("dashboard"))
    assert dash["metadata"]["labels"]["grafana_dashboard"] == "1"
    json.loads(dash["data"]["thaw.json"])


@needs_helm
def test_the_admin_port_is_apart_from_the_clients_service():
    """Clients reach thaw through a Service with the proxy port only; the
    admin port (/status lists tenants and models) has a Service of its own,
    which the activators find each other by and Prometheus scrapes; with
    networkPolicy.enabled only the other activators and adminFrom reach it."""
    objs = render("thaw", *ALL_ON)
    svcs = {o["metadata"]["name"]: o for o in by_kind(objs, "Service")}
    assert [p["name"] for p in svcs["rel"]["spec"]["ports"]] == ["http"]
    assert [p["name"] for p in svcs["rel-admin"]["spec"]["ports"]] == ["admin"]
    cm = next(o for o in by_kind(objs, "ConfigMap") if o["metadata"]["name"] == "rel")
    assert json.loads(cm["data"]["config.json"])["kubernetes"]["peers_service"] == "rel-admin"
    wanted = by_kind(objs, "ServiceMonitor")[0]["spec"]["selector"]["matchLabels"]
    scraped = [n for n, s in svcs.items() if wanted.items() <= s["metadata"]["labels"].items()]
    assert scraped == ["rel-admin"]
    pods = by_kind(objs, "Deployment")[0]["spec"]["template"]["metadata"]["labels"]
    policy = by_kind(objs, "NetworkPolicy")[0]["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= pods.items()
    assert policy["policyTypes"] == ["Ingress"]
    rules = {r["ports"][0]["port"]: r.get("from") for r in policy["ingress"]}
    assert rules["http"] is None  # everyone
    assert rules["admin"] == [{"podSelector": {"matchLabels": policy["podSelector"]["matchLabels"]}},
                              {"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}]
    narrowed = by_kind(render("thaw", "networkPolicy.enabled=true",
                              "networkPolicy.clientsFrom[0].namespaceSelector.matchLabels.x=y"),
                       "NetworkPolicy")[0]["spec"]["ingress"][0]
    assert narrowed["from"] == [{"namespaceSelector": {"matchLabels": {"x": "y"}}}]
    assert by_kind(render("thaw"), "NetworkPolicy") == []


@needs_helm
def test_model_chart_shape():
    objs = render("thaw-model", "thawAnnotations.aliases=meta-llama/Llama-3.1-8B",
                  "thaw.service=thaw.thaw-system.svc.cluster.local", namespace="models")
    d = by_kind(objs, "Deployment")[0]
    assert "replicas" not in d["spec"]  # thaw's (see test_upgrade_leaves_replicas_to_thaw)
    assert d["metadata"]["labels"]["thaw.dev/model"] == "rel"
    assert d["spec"]["template"]["metadata"]["labels"]["thaw.dev/model"] == "rel"
    anns = d["metadata"]["annotations"]
    assert anns["thaw.dev/aliases"] == "meta-llama/Llama-3.1-8B"
    assert anns["thaw.dev/service"] == "rel-private"
    assert anns["thaw.dev/startup-timeout"] == "900s"  # as long as the startup probe allows
    c = d["spec"]["template"]["spec"]["containers"][0]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 600
    svcs = {s["metadata"]["name"]: s for s in by_kind(objs, "Service")}
    assert svcs["rel"]["spec"]["type"] == "ExternalName"
    assert svcs["rel"]["spec"]["externalName"] == "thaw.thaw-system.svc.cluster.local"
    assert svcs["rel-private"]["spec"]["selector"]["app.kubernetes.io/name"] == "rel"
    llama = by_kind(render("thaw-model", "server.kind=llamacpp"), "Deployment")[0]
    assert "llama.cpp" in llama["spec"]["template"]["spec"]["containers"][0]["image"]


def replicas_patch(original, modified, live):
    """What Helm 3's three-way merge (original: the previous release's manifest, modified:
    the new one, live: the cluster's object) does to spec.replicas: ("set", n), ("delete",
    None) (the API server then defaults it to 1), or None when it leaves it alone."""
    o, m, cur = (x["spec"].get("replicas") for x in (original, modified, live))
    if "replicas" in modified["spec"]:
        return ("set", m) if m != cur else None
    if "replicas" in original["spec"]:
        return ("delete", None)
    return None


@needs_helm
def test_upgrade_leaves_replicas_to_thaw():
    """`helm upgrade` of a model thaw has scaled to 3 must not touch its replicas (it used to
    render replicas: 0, so every upgrade scaled a serving model to zero, and GitOps tools saw
    drift forever)."""
    sets = ["thaw.service=thaw.thaw-system.svc.cluster.local"]
    install = render("thaw-model", *sets, namespace="models")
    upgrade = [d for d in yaml.safe_load_all(helm(
        "template", "rel", os.path.join(CHARTS, "thaw-model"), "--namespace", "models",
        "--is-upgrade", "--set", sets[0], "--set", "thawAnnotations.idle-timeout=20m").stdout)
        if d]
    dep_install = by_kind(install, "Deployment")[0]
    dep_upgrade = by_kind(upgrade, "Deployment")[0]
    live = json.loads(json.dumps(dep_install))
    live["spec"]["replicas"] = 3  # thaw scaled it
    assert replicas_patch(dep_install, dep_upgrade, live) is None
    assert replicas_patch(dep_upgrade, dep_upgrade, live) is None  # and the next upgrade
    assert "replicas" not in dep_install["spec"] and "replicas" not in dep_upgrade["spec"]
    # The upgrade changes what was asked for, and nothing else of the spec.
    assert dep_upgrade["metadata"]["annotations"]["thaw.dev/idle-timeout"] == "20m"
    assert dep_upgrade["spec"] == dep_install["spec"]
    # What a 0.1.0 release (replicas: 0) becomes at its first upgrade: removed, reset to 1
    # once by the API server (docs/deploy.md says so).
    old = json.loads(json.dumps(dep_install))
    old["spec"]["replicas"] = 0
    assert replicas_patch(old, dep_upgrade, live) == ("delete", None)


def promtool():
    p = shutil.which("promtool")
    if not p:
        pytest.skip("promtool not installed")
    return p


def test_alert_rules_check_and_unit_tests(tmp_path):
    pt = promtool()
    src = open(os.path.join(CHARTS, "thaw", "files", "alerts.yaml")).read()
    (tmp_path / "alerts.yaml").write_text(src.replace("COLD_START_SLOW_SECONDS", "300"))
    shutil.copy(os.path.join(ROOT, "tests", "prometheus", "alerts_test.yaml"), tmp_path)
    r = subprocess.run([pt, "check", "rules", "alerts.yaml"], cwd=tmp_path, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([pt, "test", "rules", "alerts_test.yaml"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr


PROMQL_WORDS = {"sum", "by", "rate", "increase", "avg", "max", "min", "histogram_quantile",
                "or", "and", "unless", "without", "count", "on", "ignoring", "group_left",
                "group_right", "offset", "bool"}


def metric_names(expr):
    """Metric names in a PromQL expression (label matchers, grouping labels,
    ranges and function names left out)."""
    e = re.sub(r'"[^"]*"', "", expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(\s*\()?", e):
        w, call = m.group(1), m.group(2)
        if call or w in PROMQL_WORDS:
            continue
        names.add(re.sub(r"_(bucket|sum|count)$", "", w))
    return names


def test_dashboard_queries_use_metrics_that_exist(thaw_factory):
    # A live thaw with a process model: the metric names it exports.
    t = thaw_factory({"gpus": [{"id": 0, "slices": 4}],
                      "models": [sim_model(load_ms=50, gpu_slices=1)]})
    assert complete(t).status == 200
    _, text = t.admin("/metrics")
    exported = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    exported |= {"thaw_kubernetes_api_errors_total", "thaw_kubernetes_synced", "thaw_leader",
                 "thaw_peers", "thaw_kubernetes_watch_restarts_total"}  # Kubernetes-only
    # The alert's unit test feeds the cold-start buckets thaw really exports.
    exported_le = set(re.findall(r'thaw_cold_start_seconds_bucket\{[^}]*le="([^"]+)"', text))
    fed_le = set(re.findall(r"thaw_cold_start_seconds_bucket\{[^}]*le=\"([^\"]+)\"",
                            open(os.path.join(ROOT, "tests", "prometheus", "alerts_test.yaml")).read()))
    assert fed_le and fed_le <= exported_le, fed_le - exported_le
    dash = json.load(open(os.path.join(CHARTS, "thaw", "files", "dashboard.json")))
    assert dash["panels"]
    for p in dash["panels"]:
        for tgt in p["targets"]:
            for name in metric_names(tgt["expr"]):
                assert name in exported or name in DCGM, f"{p['title']}: {name} is not exported"
    alerts = yaml.safe_load(open(os.path.join(CHARTS, "thaw", "files", "alerts.yaml")))
    for g in alerts["groups"]:
        for r in g["rules"]:
            for name in metric_names(r["expr"].replace("COLD_START_SLOW_SECONDS", "1")):
                assert name in exported or name in DCGM, f"{r['alert']}: {name}"


def test_prometheus_scrapes_a_cold_start(thaw_factory, tmp_path):
    prom = shutil.which("prometheus")
    if not prom:
        pytest.skip("prometheus not installed")
    # A 3 s load falls inside the histogram's (2.5, 5] bucket: on its 2.5 s
    # bound, a start timed a millisecond short landed in the bucket below.
    t = thaw_factory({"models": [sim_model(load_ms=3000, max_concurrency=1)]})
    port = free_port()
    (tmp_path / "prom.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "thaw", "static_configs": [{"targets": [t.admin_addr]}]}]}))
    p = subprocess.Popen([prom, f"--config.file={tmp_path}/prom.yml",
                          f"--storage.tsdb.path={tmp_path}/data",
                          f"--web.listen-address=127.0.0.1:{port}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def query(q):
            url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": q})
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    return json.load(r)["data"]["result"]
            except OSError:
                return None
        wait_for(lambda: query("up{job='thaw'}") and query("up{job='thaw'}")[0]["value"][1] == "1",
                 timeout=30, what="prometheus scraping thaw")
        res = {}
        ths = [threading.Thread(target=lambda i=i: res.__setitem__(i, complete(t))) for i in range(3)]
        for th in ths:
            th.start()
        # While the model loads, requests are held: Prometheus sees the queue.
        wait_for(lambda: (query('sum(thaw_queue_depth{model="llama"})') or [{"value": [0, "0"]}])
                 [0]["value"][1] not in ("0",), timeout=20, what="queue depth seen")
        for th in ths:
            th.join(60)
        assert all(r.status == 200 for r in res.values())
        wait_for(lambda: (query('thaw_cold_start_seconds_count{model="llama"}') or
                          [{"value": [0, "0"]}])[0]["value"][1] == "1", timeout=20,
                 what="cold start histogram seen")
        q = query('histogram_quantile(0.5, sum by (le) (thaw_cold_start_seconds_bucket{model="llama"}))')
        assert q and 2.0 < float(q[0]["value"][1]) <= 5.0
    finally:
        p.terminate()
        p.wait(20)


def deployment_pod(objs):
    return by_kind(objs, "Deployment")[0]["spec"]["template"]["spec"]


def server_env(pod):
    return {e["name"]: e.get("value") for e in pod["containers"][0].get("env", [])}


@needs_helm
def test_weights_cache_on_the_node_filled_by_an_init_container():
    pod = deployment_pod(render("thaw-model", *MODEL_OPTIONS["hostPath+initContainer"]))
    cache = next(v for v in pod["volumes"] if v["name"] == "cache")
    assert cache["hostPath"] == {"path": "/var/lib/thaw/weights", "type": "DirectoryOrCreate"}
    env = server_env(pod)
    assert env["HF_HOME"] == "/root/.cache/huggingface" == env["LLAMA_CACHE"]
    assert env["HF_HUB_OFFLINE"] == "1"  # a start never reaches the Hub
    init = pod["initContainers"][0]
    assert init["name"] == "download-weights" and init["args"][-1] == HF
    assert {"name": "cache", "mountPath": "/root/.cache/huggingface"} in init["volumeMounts"]


@needs_helm
def test_shared_weights_claim_filled_once_by_a_job():
    objs = render("thaw-model", *MODEL_OPTIONS["sharedPvc+job"], namespace="models")
    pvc = by_kind(objs, "PersistentVolumeClaim")[0]
    assert pvc["metadata"]["name"] == "rel-weights"
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["spec"]["storageClassName"] == "nfs"
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    job = by_kind(objs, "Job")[0]
    jc = job["spec"]["template"]["spec"]["containers"][0]
    marker = next(e["value"] for e in jc["env"] if e["name"] == "THAW_MARKER")
    pod = deployment_pod(objs)
    wait = pod["initContainers"][0]
    assert wait["name"] == "wait-for-weights"
    assert next(e["value"] for e in wait["env"] if e["name"] == "THAW_MARKER") == marker
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "cache")
    assert mount["readOnly"] is True  # replicas only read the shared claim
    assert next(v for v in pod["volumes"] if v["name"] == "cache")[
        "persistentVolumeClaim"]["claimName"] == "rel-weights"
    # The Job's name follows what it downloads: the same values, the same Job.
    again = by_kind(render("thaw-model", *MODEL_OPTIONS["sharedPvc+job"], namespace="models"),
                    "Job")[0]
    other = by_kind(render("thaw-model", *MODEL_OPTIONS["sharedPvc+job"],
                           "server.download.model=Qwen/Qwen3-8B", namespace="models"), "Job")[0]
    assert again["metadata"]["name"] == job["metadata"]["name"] != other["metadata"]["name"]


@needs_helm
def test_existing_and_read_only_many_claims():
    objs = render("thaw-model", *MODEL_OPTIONS["pvc+job"])
    assert not by_kind(objs, "PersistentVolumeClaim")  # the claim is the user's
    pod = deployment_pod(objs)
    assert next(v for v in pod["volumes"] if v["name"] == "cache")[
        "persistentVolumeClaim"]["claimName"] == "weights"
    jc = by_kind(objs, "Job")[0]["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token",
                                                               "key": "HF_TOKEN"}}} in jc["env"]
    rox = render("thaw-model", *MODEL_OPTIONS["sharedPvc-ROX-snapshot"])
    pvc = by_kind(rox, "PersistentVolumeClaim")[0]
    assert pvc["spec"]["accessModes"] == ["ReadOnlyMany"]
    assert pvc["spec"]["dataSource"]["kind"] == "VolumeSnapshot"
    assert not by_kind(rox, "Job") and "initContainers" not in deployment_pod(rox)
    # chart 0.2's bare cache.pvc still means that claim
    old = deployment_pod(render("thaw-model", "server.cache.pvc=weights"))
    assert next(v for v in old["volumes"] if v["name"] == "cache")[
        "persistentVolumeClaim"]["claimName"] == "weights"


@needs_helm
@pytest.mark.parametrize("sets,why", [
    (["server.download.mode=job", f"server.download.model={HF}"], "download at every start"),
    (["server.cache.type=hostPath", "server.download.mode=job", f"server.download.model={HF}"],
     "only the node it runs on"),
    (["server.cache.type=hostPath", "server.download.mode=initContainer"], "download.model"),
    (["server.cache.type=sharedPvc", "server.cache.shared.accessMode=ReadOnlyMany",
      "server.download.mode=job", f"server.download.model={HF}"], "cannot be written"),
    (["server.cache.type=pvc"], "existing claim"),
])
def test_cache_combinations_that_cannot_work_fail_the_render(sets, why):
    args = ["template", "rel", os.path.join(CHARTS, "thaw-model")]
    for x in sets:
        args += ["--set", x]
    r = helm(*args, check=False)
    assert r.returncode != 0 and why in r.stderr, r.stderr


@needs_helm
def test_default_cache_is_an_empty_dir_without_a_download():
    objs = render("thaw-model")
    pod = deployment_pod(objs)
    assert next(v for v in pod["volumes"] if v["name"] == "cache")["emptyDir"]
    assert not by_kind(objs, "Job") and not by_kind(objs, "DaemonSet")
    assert "initContainers" not in pod and "HF_HUB_OFFLINE" not in server_env(pod)


@needs_helm
def test_image_prepull_daemonset_runs_the_model_image_on_its_gpu_nodes():
    objs = render("thaw-model", *MODEL_OPTIONS["prepull"], namespace="models")
    ds = by_kind(objs, "DaemonSet")[0]
    spec = ds["spec"]["template"]["spec"]
    server = deployment_pod(objs)["containers"][0]
    pull = spec["initContainers"][0]
    assert pull["image"] == server["image"] and pull["command"] == ["sh", "-c", "exit 0"]
    assert pull["imagePullPolicy"] == server["imagePullPolicy"] == "IfNotPresent"
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true", "pool": "gpu-a100"}
    assert spec["tolerations"] == deployment_pod(objs)["tolerations"]
    assert "nvidia.com/gpu" not in json.dumps(spec.get("containers"))  # holds no GPU
    # its pods are not the model's: neither the Deployment's selector nor the Service's
    sel = by_kind(objs, "Deployment")[0]["spec"]["selector"]["matchLabels"]
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in sel.items())
    llama = by_kind(render("thaw-model", "server.kind=llamacpp", "prepull.enabled=true"),
                    "DaemonSet")[0]
    assert "llama.cpp" in llama["spec"]["template"]["spec"]["initContainers"][0]["image"]


@needs_helm
def test_sleep_mode_turns_on_vllm_and_the_annotations():
    objs = render("thaw-model", *MODEL_OPTIONS["sleep"])
    d = by_kind(objs, "Deployment")[0]
    anns = d["metadata"]["annotations"]
    assert anns["thaw.dev/sleep-mode"] == "2" and anns["thaw.dev/idle-before-sleep"] == "5m"
    c = d["spec"]["template"]["spec"]["containers"][0]
    assert c["args"].count("--enable-sleep-mode") == 1
    assert server_env(d["spec"]["template"]["spec"])["VLLM_SERVER_DEV_MODE"] == "1"
    off = by_kind(render("thaw-model"), "Deployment")[0]
    assert "thaw.dev/sleep-mode" not in off["metadata"]["annotations"]
    assert "--enable-sleep-mode" not in off["spec"]["template"]["spec"]["containers"][0]["args"]
    r = helm("template", "rel", os.path.join(CHARTS, "thaw-model"), "--set", "sleep.enabled=true",
             "--set", "server.kind=llamacpp", check=False)
    assert r.returncode != 0 and "server.kind=vllm" in r.stderr
