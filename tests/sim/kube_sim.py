#!/usr/bin/python3
"""A Kubernetes API server simulator for thaw's tests (Python standard library).

It serves the API paths thaw and kubectl use, in the Kubernetes shape, and
runs the controllers a cluster runs behind them, written from the Kubernetes
documentation and API conventions:

  /api, /api/v1, /apis, /apis/{group}/{version}, /version   discovery
  core/v1 pods, nodes, events, services, namespaces,         list, watch, get, create, update,
          secrets, configmaps
                                                             patch, delete (+ /status)
  apps/v1 deployments, replicasets (+ /scale, /status)       list, watch, get, create, update,
                                                             patch, delete
  discovery.k8s.io/v1 endpointslices                         list, watch, get, create, update,
                                                             patch, delete
  coordination.k8s.io/v1 leases                              list, watch, get, create, update,
                                                             patch, delete

Patches: JSON merge patch, strategic merge patch (lists of containers, ports,
env, volumes, conditions... merged by their keys; $patch, $setElementOrder,
$retainKeys, $deleteFromPrimitiveList directives) and JSON patch. Writes to an
object ignore its status (and /status writes only its status), as the real
server does for kinds with a status subresource; metadata.generation moves
when the spec does. Lists carry resourceVersion and are paged when asked
(limit, continue; a token older than the retained history is 410 Expired);
watches stream one JSON
event per line (chunked) with BOOKMARKs when asked (allowWatchBookmarks) and
end after timeoutSeconds; label selectors (=, ==, !=, exists, !exists, in,
notin) and field selectors (metadata.name, metadata.namespace, spec.nodeName,
status.phase, any dotted path; a watch with selectors sees an object that
comes to match as ADDED and one that stops matching as DELETED); 409 on a
stale resourceVersion or an existing name; 422 on an invalid object; a watch
from a resourceVersion older than the retained history gets an ERROR event
with a 410 Status (as the real server does), and one from a resourceVersion
the server has not reached (restored from an older etcd, restarted empty)
waits 3 s for it, then gets 504 ResourceVersionTooLarge, as the real watch
cache answers. A namespace comes to exist
when first used (as with the NamespaceAutoProvision admission plugin).
Bodies are JSON (protobuf gets 415, so `kubectl create deployment` does not
work; `kubectl apply --validate=false` does: there is no OpenAPI document);
lists are not served as Tables (kubectl prints NAME and AGE). Bearer tokens
(401 otherwise) and TLS (--cert/--key) as the tests set up.

The cluster (one process plays the controller manager, the scheduler and the
kubelets of every node):

- Deployment controller: a Deployment owns ReplicaSets named
  <deployment>-<pod-template-hash> (labelled pod-template-hash, annotated
  deployment.kubernetes.io/revision, desired-replicas, max-replicas); a
  template change starts a RollingUpdate (maxSurge rounded up, maxUnavailable
  rounded down, 25% each by default) or a Recreate, as spec.strategy says;
  replica changes scale the active ReplicaSets proportionally; status has
  observedGeneration, replicas, updatedReplicas, readyReplicas,
  availableReplicas, unavailableReplicas and the Available and Progressing
  conditions (so `kubectl rollout status` works); old ReplicaSets beyond
  spec.revisionHistoryLimit go. The Deployment's spec.selector (matchLabels,
  matchExpressions) selects its pods; no other label is needed.
- ReplicaSet controller: a ReplicaSet owns Pods named <replicaset>-<5 chars>
  with the template's labels; it deletes the least valuable pods first
  (unscheduled, pending, not ready, newest) when scaling down.
- Garbage collector: objects whose owners (ownerReferences uid) are gone are
  deleted (background propagation; Foreground is treated as Background;
  propagationPolicy=Orphan keeps them, without the owner's reference).
- Scheduler: a node fits when it is not cordoned (spec.unschedulable), its
  NoSchedule/NoExecute taints are tolerated, nodeSelector and required
  nodeAffinity match its labels, and every requested resource (requests,
  defaulting to limits, as for nvidia.com/gpu) fits in its allocatable minus
  what the pods bound to it request (terminating ones too), plus the pod
  count. Otherwise PodScheduled=False, reason Unschedulable, with the real
  scheduler's message ("0/3 nodes are available: 1 node(s) were
  unschedulable, 2 Insufficient nvidia.com/gpu. preemption: ..."); it retries
  while the pod is pending.
- Kubelet: a bound pod's container starts at once: the pod is Running with a
  loopback pod IP (127.N.x.y) while the server inside is still loading. The
  server is thaw-model-sim ("c", the default) or the counterpart
  tests/counterparts/asyncio_server.py ("asyncio") or loadtest/asyncio_model.py
  ("asyncio-model"), as the pod annotation sim.thaw.dev/server says; sim.thaw.dev/loading is bind-late (the default:
  not listening until loaded) or 503 (listening, 503 while loading);
  sim.thaw.dev/load-ms the load time (default --load-ms),
  sim.thaw.dev/pull-ms an image pull before the container starts (the pod
  stays Pending with its container waiting in ContainerCreating; the kubelet
  records Pulling `Pulling image "x"` and then Pulled `Successfully pulled
  image "x" in 1.234s (1.234s including waiting). Image size: N bytes.`),
  sim.thaw.dev/schedule-delay-ms how long the scheduler takes to get to the
  pod (it stays Pending without a PodScheduled condition until then),
  sim.thaw.dev/token-ms the time per token, sim.thaw.dev/ready-file (c and asyncio-model)
  a file the server writes when loaded, sim.thaw.dev/sleep-fault (c: fail-sleep or
  fail-wake, the sleep-mode call the server answers 500), sim.thaw.dev/sleep-ms and
  sim.thaw.dev/wake-ms (c: how long /sleep and /wake_up take), sim.thaw.dev/sleep-mode
  (asyncio: "true" serves vLLM's sleep mode, as --enable-sleep-mode; c always
  does), sim.thaw.dev/error-pct (c)
  the share of completions answered 500. The model name is the pod's
  thaw.dev/model label ("sim" without one). Probes run as the kubelet runs them: readiness once
  when the container starts and then every periodSeconds (default 10 s;
  --kubelet-period-ms overrides every probe's period), honouring
  initialDelaySeconds, timeoutSeconds, successThreshold, failureThreshold;
  startupProbe holds readiness and liveness back until it succeeds; liveness
  or startup failure restarts the container. httpGet (200-399 is success) and
  tcpSocket probes (exec and grpc probes have nothing to run in and pass); a
  container without a readinessProbe is ready when it starts. Only a pod's
  first container runs a server; the others count as started and ready. Pods
  bound to a node that does not exist are not run. A server that exits is
  restarted with the kubelet's back-off (10 s, 20 s, ... 300 s). Deletion: deletionTimestamp set (the endpoint turns
  terminating), SIGTERM, SIGKILL after the grace period
  (terminationGracePeriodSeconds, 30 s, or the delete's gracePeriodSeconds),
  then the pod is gone.
- EndpointSlice controller: for each Service with a selector, EndpointSlices
  labelled kubernetes.io/service-name and endpointslice.kubernetes.io/managed-
  by: endpointslice-controller.k8s.io, owned by the Service, at most 100
  endpoints each: the selected pods that have an IP, with conditions ready,
  serving, terminating, targetRef and nodeName; ports from the Service's
  ports (targetPort resolved against the pods' named container ports).
  EndpointSlices created by others are left alone.
- Node lifecycle: a cordoned node gets the node.kubernetes.io/unschedulable
  NoSchedule taint.
- Events, as the components record them (counted when repeated):
  ScalingReplicaSet (deployment-controller), SuccessfulCreate and
  SuccessfulDelete (replicaset-controller), Scheduled and FailedScheduling
  (default-scheduler), Pulling and Pulled (with sim.thaw.dev/pull-ms), Started,
  Killing, Unhealthy and BackOff (kubelet).

Nodes: --nodes takes a JSON list of {"name", "gpus" (1), "replicas" (1; GPU
sharing: allocatable nvidia.com/gpu = gpus x replicas), "product", "labels",
"taints" ([{"key", "value", "effect"}] or ["key=value:Effect"]),
"unschedulable", "allocatable" and "capacity" (any resources, e.g.
"nvidia.com/mig-1g.10gb": "7"; cpu 32, memory 256Gi, pods 110 by default)}.

Fault controls (POST /_sim/faults with JSON): {"drop_watches": true},
{"fail_next": N} (next N API requests answer 500; with "fail_matching": S
only requests whose body holds S), {"delay_ms": N} (with
"delay_methods": ["PATCH", ...] only requests of those methods),
{"compact": true} (forget history: old resourceVersions get 410),
{"expire_pages": true} (every list continue token gets 410 Expired),
{"refuse_watches": true} (every watch answers 403, as for a Role without watch),
{"tokens": [...]} (accepted bearer tokens). GET /_sim/state shows counters,
the scale log, nodes (their pods and requested resources), ReplicaSets and
pods. --state FILE keeps objects across a restart (written on SIGTERM, read
at start; the pods' processes keep running and are adopted, as a node's
would). SIGINT stops everything.
"""

import argparse
import bisect
import calendar
import concurrent.futures
import base64
import copy
import json
import math
import os
import random
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RESOURCES = {
    # (group, version, plural): (kind, namespaced)
    ("", "v1", "pods"): ("Pod", True),
    ("", "v1", "nodes"): ("Node", False),
    ("", "v1", "events"): ("Event", True),
    ("", "v1", "services"): ("Service", True),
    ("", "v1", "namespaces"): ("Namespace", False),
    ("", "v1", "secrets"): ("Secret", True),
    ("", "v1", "configmaps"): ("ConfigMap", True),
    ("apps", "v1", "deployments"): ("Deployment", True),
    ("apps", "v1", "replicasets"): ("ReplicaSet", True),
    ("discovery.k8s.io", "v1", "endpointslices"): ("EndpointSlice", True),
    ("coordination.k8s.io", "v1", "leases"): ("Lease", True),
}
SHORT = {"pods": ["po"], "nodes": ["no"], "events": ["ev"], "services": ["svc"],
         "namespaces": ["ns"], "secrets": [], "configmaps": ["cm"], "deployments": ["deploy"], "replicasets": ["rs"],
         "endpointslices": [], "leases": []}
# Kinds whose status is written only through their /status subresource.
STATUS_SUBRESOURCE = {"pods", "nodes", "services", "namespaces", "deployments", "replicasets"}
SCALABLE = {"deployments", "replicasets"}

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# The alphabet of generated name suffixes and of pod-template-hash.
SAFE_CHARS = "bcdfghjklmnpqrstvwxz2456789"
MANAGED_BY = "endpointslice-controller.k8s.io"
MAX_ENDPOINTS_PER_SLICE = 100
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def now_iso(offset_s=0):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + offset_s))


def api_version(group, version):
    return f"{group}/{version}" if group else version


def status_obj(code, reason, message, details=None):
    s = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
         "message": message, "reason": reason, "code": code}
    if details:
        s["details"] = details
    return s


class ApiError(Exception):
    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message
        self.details = details


def invalid(kind, name, causes):
    """422 in the API server's words: `Deployment.apps "x" is invalid: field: why`."""
    return ApiError(422, "Invalid", f'{kind} "{name}" is invalid: ' + ", ".join(causes))


def validate_data(plural, obj, causes):
    """A Secret's data values are base64 (stringData is merged into data, as
    the API server does on write); a ConfigMap's data values are strings."""
    data = obj.get("data") or {}
    if not isinstance(data, dict):
        causes.append("data: Invalid value: must be an object")
        return
    if plural == "secrets":
        for k, v in (obj.pop("stringData", None) or {}).items():
            data[k] = base64.b64encode(str(v).encode()).decode()
        for k, v in data.items():
            try:
                base64.b64decode(v, validate=True)
            except (ValueError, TypeError):
                causes.append(f"data[{k}]: Invalid value: illegal base64 data")
        obj.setdefault("type", "Opaque")
    elif any(not isinstance(v, str) for v in data.values()):
        causes.append("data: Invalid value: values must be strings")
    if data:
        obj["data"] = data


def random_suffix(n=5):
    return "".join(random.choices(SAFE_CHARS, k=n))


# --- quantities and selectors ---------------------------------------------------

_SUFFIX = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1,
           "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?:[eE]([+-]?[0-9]+))?"
                       r"(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?")


def quantity(v):
    """A resource.Quantity ("500m", "1Gi", "2", 2) as an exact Fraction."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return Fraction(v)
    m = _QUANTITY.fullmatch(str(v).strip())
    if not m:
        raise ValueError(f"quantities must match the regular expression "
                         f"'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {v!r}")
    n = Fraction(m.group(1))
    if m.group(2):
        n *= Fraction(10) ** int(m.group(2))
    return n * _SUFFIX[m.group(3) or ""]


def fmt_quantity(q):
    if q.denominator == 1:
        return str(q.numerator)
    return f"{math.ceil(q * 1000)}m"


def parse_label_selector(sel):
    """A label selector string (?labelSelector=) as a predicate over labels."""
    if not sel:
        return lambda labels: True
    reqs = []
    parts, depth, cur = [], 0, ""
    for ch in sel:  # split on commas not inside parentheses
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    for p in (x.strip() for x in parts):
        if not p:
            continue
        m = re.fullmatch(r"(\S+)\s+(in|notin)\s*\((.*)\)", p)
        if m:
            k, op, vals = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
            if op == "in":
                reqs.append(lambda l, k=k, vals=vals: k in l and l[k] in vals)
            else:
                reqs.append(lambda l, k=k, vals=vals: k not in l or l[k] not in vals)
        elif "!=" in p:
            k, v = p.split("!=", 1)
            reqs.append(lambda l, k=k.strip(), v=v.strip(): l.get(k) != v)
        elif "=" in p:
            k, v = p.split("==" if "==" in p else "=", 1)
            reqs.append(lambda l, k=k.strip(), v=v.strip(): l.get(k) == v)
        elif p.startswith("!"):
            reqs.append(lambda l, k=p[1:].strip(): k not in l)
        else:
            reqs.append(lambda l, k=p: k in l)
    return lambda labels: all(r(labels or {}) for r in reqs)


def parse_field_selector(sel):
    if not sel:
        return lambda obj: True
    reqs = []
    for p in sel.split(","):
        if not p.strip():
            continue
        neg = "!=" in p
        if not neg and "=" not in p:
            raise ApiError(400, "BadRequest", f"invalid field selector: {p!r}")
        k, v = p.split("!=" if neg else ("==" if "==" in p else "="), 1)
        reqs.append((k.strip().split("."), v.strip(), neg))

    def pred(obj):
        for path, v, neg in reqs:
            cur = obj
            for seg in path:
                cur = cur.get(seg) if isinstance(cur, dict) else None
            cur = "" if cur is None else str(cur)
            if (cur == v) == neg:
                return False
        return True
    return pred


def _expression_matches(labels, key, op, values):
    """One metav1.LabelSelectorRequirement / NodeSelectorRequirement."""
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt"):
        try:
            have, want = int(labels[key]), int(values[0])
        except (KeyError, ValueError, IndexError):
            return False
        return have > want if op == "Gt" else have < want
    return False


def selector_pred(sel):
    """A metav1.LabelSelector as a predicate. An absent selector selects
    nothing, an empty one everything (API conventions)."""
    if sel is None:
        return lambda labels: False
    ml = sel.get("matchLabels") or {}
    exprs = sel.get("matchExpressions") or []

    def pred(labels):
        labels = labels or {}
        return (all(labels.get(k) == v for k, v in ml.items()) and
                all(_expression_matches(labels, e.get("key"), e.get("operator"),
                                        e.get("values") or []) for e in exprs))
    return pred


def selector_string(sel):
    """A metav1.LabelSelector in the string form (Scale's status.selector)."""
    out = [f"{k}={v}" for k, v in sorted((sel or {}).get("matchLabels", {}).items())]
    for e in (sel or {}).get("matchExpressions") or []:
        op, k, vals = e.get("operator"), e.get("key"), ",".join(sorted(e.get("values") or []))
        out.append({"In": f"{k} in ({vals})", "NotIn": f"{k} notin ({vals})",
                    "Exists": k, "DoesNotExist": f"!{k}"}.get(op, k))
    return ",".join(out)


# --- patches ----------------------------------------------------------------

def merge_patch(target, patch):
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# Lists the Kubernetes types declare patchStrategy "merge" for, with their key.
# "ports" is keyed by containerPort in a container and by port in a Service.
MERGE_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name",
              "env": "name", "volumes": "name", "volumeMounts": "mountPath",
              "volumeDevices": "devicePath", "imagePullSecrets": "name", "conditions": "type",
              "ownerReferences": "uid", "hostAliases": "ip", "ports": "port",
              "topologySpreadConstraints": "topologyKey", "resourceClaims": "name"}


def _strip_directives(v):
    if isinstance(v, dict):
        return {k: _strip_directives(x) for k, x in v.items()
                if not k.startswith("$") and x is not None}
    if isinstance(v, list):
        return [_strip_directives(x) for x in v]
    return v


def list_page(store, plural, ns, kind, apiv, lsel, fsel, q):
    """A list response, paged as the API server pages it (limit and
    continue): later pages come from the first page's snapshot, at its
    resourceVersion; a token whose resourceVersion is older than the retained
    history (or no longer kept) is 410 Expired, as a compacted etcd makes it."""
    limit = int(q.get("limit") or 0)
    token = q.get("continue")
    if token:
        kept = store.take_pages(token)
        if kept is None:
            raise ApiError(410, "Expired", "The provided continue parameter is too old to "
                           "display a consistent list result. You can start a new list "
                           "without the continue parameter.")
        rv, items = kept
    else:
        items, rv = store.list(plural, ns, lsel, fsel)
    md = {"resourceVersion": str(rv)}
    if limit > 0 and len(items) > limit:
        md["continue"] = store.keep_pages(int(rv), items[limit:])
        md["remainingItemCount"] = len(items) - limit
        items = items[:limit]
    return {"kind": kind + "List", "apiVersion": apiv, "metadata": md, "items": items}


def _merge_list(cur, patch, key):
    if key == "port" and any(isinstance(i, dict) and "containerPort" in i for i in cur + patch):
        key = "containerPort"
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [_strip_directives(i) for i in patch if not (isinstance(i, dict) and "$patch" in i)]
    if not all(isinstance(i, dict) and key in i for i in patch):
        return _strip_directives(patch)
    out = copy.deepcopy(cur)
    for item in patch:
        idx = next((n for n, c in enumerate(out) if isinstance(c, dict) and c.get(key) == item[key]),
                   None)
        if item.get("$patch") == "delete":
            if idx is not None:
                del out[idx]
        elif idx is not None:
            out[idx] = strategic_merge_patch(out[idx], item)
        else:
            out.append(_strip_directives(item))
    return out


def strategic_merge_patch(target, patch):
    """Kubernetes strategic merge patch, for the fields this server's kinds have."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return _strip_directives(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k in ("$patch", "$retainKeys") or k.startswith("$setElementOrder/"):
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            field = k.split("/", 1)[1]
            out[field] = [x for x in out.get(field) or [] if x not in v]
            continue
        if v is None:
            out.pop(k, None)
        elif isinstance(v, dict):
            if v.get("$patch") == "delete":
                out.pop(k, None)
            else:
                out[k] = strategic_merge_patch(out.get(k), v)
        elif isinstance(v, list) and k in MERGE_KEYS and isinstance(out.get(k), list):
            out[k] = _merge_list(out[k], v, MERGE_KEYS[k])
        else:
            out[k] = _strip_directives(v)
    return out


def json_patch(target, ops):
    """RFC 6902 JSON patch (add, remove, replace, test, copy, move)."""
    doc = copy.deepcopy(target)

    def walk(path):
        if not path.startswith("/"):
            raise ApiError(422, "Invalid", f"json patch: bad path {path!r}")
        segs = [s.replace("~1", "/").replace("~0", "~") for s in path[1:].split("/")]
        parent = doc
        for s in segs[:-1]:
            parent = parent[int(s)] if isinstance(parent, list) else parent[s]
        return parent, segs[-1]

    def get(path):
        parent, last = walk(path)
        return parent[int(last)] if isinstance(parent, list) else parent[last]

    def put(path, value, replace):
        parent, last = walk(path)
        if isinstance(parent, list):
            i = len(parent) if last == "-" else int(last)
            if replace:
                parent[i] = value
            else:
                parent.insert(i, value)
        else:
            if replace and last not in parent:
                raise KeyError(last)
            parent[last] = value

    def remove(path):
        parent, last = walk(path)
        return parent.pop(int(last)) if isinstance(parent, list) else parent.pop(last)
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "json patch: the body must be a list of operations")
    try:
        for op in ops:
            kind, path = op.get("op"), op.get("path", "")
            if kind == "add":
                put(path, copy.deepcopy(op["value"]), False)
            elif kind == "replace":
                put(path, copy.deepcopy(op["value"]), True)
            elif kind == "remove":
                remove(path)
            elif kind == "test":
                if get(path) != op.get("value"):
                    raise ApiError(422, "Invalid", f"json patch: test failed at {path}")
            elif kind == "copy":
                put(path, copy.deepcopy(get(op["from"])), False)
            elif kind == "move":
                put(path, remove(op["from"]), False)
            else:
                raise ApiError(422, "Invalid", f"json patch: unknown op {kind!r}")
    except (KeyError, IndexError, ValueError, TypeError) as e:
        raise ApiError(422, "Invalid", f"json patch: cannot apply: {e!r}")
    return doc


def apply_patch(ctype, cur, body):
    if "strategic-merge-patch" in ctype:
        return strategic_merge_patch(cur, body)
    if "merge-patch" in ctype:
        return merge_patch(cur, body)
    if "json-patch" in ctype:
        return json_patch(cur, body)
    raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown "
                   "format - accepted media types include: application/json-patch+json, "
                   "application/merge-patch+json, application/strategic-merge-patch+json")


# --- defaulting and validation (what the API server does on every write) ------

PROBE_DEFAULTS = {"timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1,
                  "failureThreshold": 3}


def default_pod_spec(spec, causes, path="spec"):
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    if not spec.get("containers"):
        causes.append(f"{path}.containers: Required value")
    for group in ("initContainers", "containers"):
        for i, c in enumerate(spec.get(group) or []):
            where = f"{path}.{group}[{i}]"
            if not c.get("name"):
                causes.append(f"{where}.name: Required value")
            res = c.setdefault("resources", {})
            limits = res.get("limits") or {}
            if limits:  # requests default to limits
                req = res.setdefault("requests", {})
                for k, v in limits.items():
                    req.setdefault(k, v)
            for kind in ("requests", "limits"):
                for k, v in (res.get(kind) or {}).items():
                    try:
                        quantity(v)
                    except ValueError as e:
                        causes.append(f"{where}.resources.{kind}[{k}]: Invalid value: {e}")
            for p in c.get("ports") or []:
                p.setdefault("protocol", "TCP")
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                if isinstance(c.get(probe), dict):
                    for k, v in PROBE_DEFAULTS.items():
                        c[probe].setdefault(k, v)
                    if "httpGet" in c[probe]:
                        c[probe]["httpGet"].setdefault("scheme", "HTTP")
                        c[probe]["httpGet"].setdefault("path", "/")
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            image = c.get("image", "")
            c.setdefault("imagePullPolicy", "Always" if image.endswith(":latest") or
                         ":" not in image.rsplit("/", 1)[-1] else "IfNotPresent")


def int_or_percent(v, total, round_up):
    """An IntOrString (2, "25%") against total: percentages round up or down."""
    if isinstance(v, str) and v.endswith("%"):
        n = int(v[:-1]) * total / 100
        return math.ceil(n) if round_up else math.floor(n)
    return int(v)


def validate_int_or_percent(v, path, causes):
    if isinstance(v, bool) or not (isinstance(v, int) or (isinstance(v, str) and
                                                          re.fullmatch(r"[0-9]+%", v))):
        causes.append(f"{path}: Invalid value: {v!r}: a valid IntOrString is an integer or "
                      "a percentage")
    elif isinstance(v, int) and v < 0:
        causes.append(f"{path}: Invalid value: {v}: must be greater than or equal to 0")


def default_workload(obj, causes, kind):
    """Deployment and ReplicaSet defaults and validation (apps/v1)."""
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    if not isinstance(spec["replicas"], int) or spec["replicas"] < 0:
        causes.append(f"spec.replicas: Invalid value: {spec['replicas']!r}: must be greater "
                      "than or equal to 0")
    if kind == "Deployment":
        st = spec.setdefault("strategy", {})
        st.setdefault("type", "RollingUpdate")
        if st["type"] == "RollingUpdate":
            ru = st.setdefault("rollingUpdate", {})
            ru.setdefault("maxSurge", "25%")
            ru.setdefault("maxUnavailable", "25%")
            validate_int_or_percent(ru["maxSurge"], "spec.strategy.rollingUpdate.maxSurge",
                                    causes)
            validate_int_or_percent(ru["maxUnavailable"],
                                    "spec.strategy.rollingUpdate.maxUnavailable", causes)
            if ru["maxSurge"] in (0, "0%") and ru["maxUnavailable"] in (0, "0%"):
                causes.append("spec.strategy.rollingUpdate.maxUnavailable: Invalid value: 0: "
                              "may not be 0 when `maxSurge` is 0")
        elif st["type"] == "Recreate":
            if st.get("rollingUpdate") is not None:
                causes.append("spec.strategy.rollingUpdate: Forbidden: may not be specified "
                              "when strategy `type` is 'Recreate'")
        else:
            causes.append(f"spec.strategy.type: Unsupported value: {st['type']!r}: supported "
                          'values: "Recreate", "RollingUpdate"')
        spec.setdefault("revisionHistoryLimit", 10)
        spec.setdefault("progressDeadlineSeconds", 600)
    spec.setdefault("minReadySeconds", 0)
    tpl = spec.setdefault("template", {})
    tpl.setdefault("metadata", {})
    default_pod_spec(tpl.setdefault("spec", {}), causes, "spec.template.spec")
    sel = spec.get("selector")
    labels = tpl["metadata"].get("labels") or {}
    if not sel or not (sel.get("matchLabels") or sel.get("matchExpressions")):
        causes.append("spec.selector: Required value")
    elif not selector_pred(sel)(labels):
        causes.append(f"spec.template.metadata.labels: Invalid value: {json.dumps(labels)}: "
                      "`selector` does not match template `labels`")


def default_service(svc, causes, alloc_ip):
    spec = svc.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec["type"] != "ExternalName":
        spec.setdefault("internalTrafficPolicy", "Cluster")
        if "clusterIP" not in spec:
            spec["clusterIP"] = alloc_ip()
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
    elif not spec.get("externalName"):
        causes.append("spec.externalName: Required value")
    for i, p in enumerate(spec.get("ports") or []):
        if not isinstance(p.get("port"), int):
            causes.append(f"spec.ports[{i}].port: Required value")
        p.setdefault("protocol", "TCP")
        if spec["type"] != "ExternalName":
            p.setdefault("targetPort", p.get("port"))
    if spec.get("selector") is not None and not isinstance(spec["selector"], dict):
        causes.append("spec.selector: Invalid value: a map of labels")
    svc.setdefault("status", {"loadBalancer": {}})


def namespace_defaults(ns):
    ns["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = ns["metadata"]["name"]
    ns.setdefault("spec", {"finalizers": ["kubernetes"]})
    ns["status"] = {"phase": "Active"}
    return ns


def default_node(node):
    node.setdefault("spec", {})
    node.setdefault("status", {})


# --- the object store -----------------------------------------------------------

class Store:
    """Objects, resourceVersions and the event history watches read."""

    def __init__(self, history=5000):
        self.lock = threading.Condition()
        self.kinds = {}  # plural -> {(ns, name): obj}
        self.rv = 100
        self.history = []  # (rv, plural, type, obj)
        self.history_max = history
        self.compacted_rv = self.rv  # history holds events after this rv
        self.pages = {}  # continue id -> (rv, items left): paged lists' snapshots
        self.page_seq = 0
        self.expire_pages = False  # fault: every continue token is 410 Expired
        self.watch_generation = 0  # bumped to drop every watch

    def _bump(self):
        self.rv += 1
        return str(self.rv)

    def _table(self, plural):
        return self.kinds.setdefault(plural, {})

    def _record(self, plural, etype, obj):
        self.history.append((int(obj["metadata"]["resourceVersion"]), plural, etype,
                             copy.deepcopy(obj)))
        if len(self.history) > self.history_max:
            drop = len(self.history) - self.history_max
            self.compacted_rv = self.history[drop - 1][0]
            del self.history[:drop]
        self.lock.notify_all()

    def create(self, plural, obj, kind, apiv):
        with self.lock:
            md = obj.setdefault("metadata", {})
            if not md.get("name") and md.get("generateName"):
                while True:
                    md["name"] = md["generateName"] + random_suffix()
                    if (md.get("namespace", ""), md["name"]) not in self._table(plural):
                        break
            if not md.get("name"):
                raise invalid(kind, "", ["metadata.name: Required value: name or generateName "
                                         "is required"])
            key = (md.get("namespace", ""), md["name"])
            if key in self._table(plural):
                raise ApiError(409, "AlreadyExists", f'{plural} "{md["name"]}" already exists')
            obj["kind"], obj["apiVersion"] = kind, apiv
            md["uid"] = str(uuid.uuid4())
            md["creationTimestamp"] = now_iso()
            md["generation"] = 1
            md["resourceVersion"] = self._bump()
            self._table(plural)[key] = obj
            self._record(plural, "ADDED", obj)
            return copy.deepcopy(obj)

    def get(self, plural, ns, name):
        with self.lock:
            o = self._table(plural).get((ns, name))
            if o is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            return copy.deepcopy(o)

    def _commit(self, plural, key, cur, new):
        """Stores new in place of cur: generation moves with the spec."""
        md = new.setdefault("metadata", {})
        for k in ("uid", "creationTimestamp", "namespace", "name", "deletionTimestamp",
                  "deletionGracePeriodSeconds"):
            if k in cur["metadata"]:
                md[k] = cur["metadata"][k]
        md["generation"] = cur["metadata"].get("generation", 1) + (
            1 if new.get("spec") != cur.get("spec") else 0)
        new["kind"], new["apiVersion"] = cur["kind"], cur["apiVersion"]
        md["resourceVersion"] = cur["metadata"]["resourceVersion"]
        if new == cur:
            return copy.deepcopy(cur)
        md["resourceVersion"] = self._bump()
        self._table(plural)[key] = new
        self._record(plural, "MODIFIED", new)
        return copy.deepcopy(new)

    def update(self, plural, ns, name, new, check_rv=True):
        with self.lock:
            key = (ns, name)
            cur = self._table(plural).get(key)
            if cur is None:
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            want_rv = new.get("metadata", {}).get("resourceVersion")
            if check_rv and want_rv and want_rv != cur["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict",
                               f'Operation cannot be fulfilled on {plural} "{name}": the object '
                               "has been modified; please apply your changes to the latest "
                               "version and try again")
            return self._commit(plural, key, cur, new)

    def mutate(self, plural, ns, name, fn):
        """Applies fn to the current object under the lock (a controller's
        write that cannot lose a client's concurrent one). None if gone."""
        with self.lock:
            key = (ns, name)
            cur = self._table(plural).get(key)
            if cur is None:
                return None
            new = copy.deepcopy(cur)
            fn(new)
            return self._commit(plural, key, cur, new)

    def delete(self, plural, ns, name, uid=None):
        with self.lock:
            cur = self._table(plural).get((ns, name))
            if cur is None or (uid and cur["metadata"]["uid"] != uid):
                raise ApiError(404, "NotFound", f'{plural} "{name}" not found')
            del self._table(plural)[(ns, name)]
            cur["metadata"]["resourceVersion"] = self._bump()
            self._record(plural, "DELETED", cur)
            return copy.deepcopy(cur)

    def list(self, plural, ns, lsel, fsel):
        with self.lock:
            items = [copy.deepcopy(o) for (n, _), o in sorted(self._table(plural).items())
                     if (ns is None or n == ns) and lsel(o["metadata"].get("labels"))
                     and fsel(o)]
            return items, str(self.rv)

    def keep_pages(self, rv, rest):
        """Keeps what is left of a paged list (a snapshot, as the API server
        serves later pages at the first one's resourceVersion); returns its
        continue token. The 64 most recent are kept."""
        with self.lock:
            self.page_seq += 1
            self.pages[self.page_seq] = (rv, rest)
            while len(self.pages) > 64:
                self.pages.pop(next(iter(self.pages)))
            return base64.urlsafe_b64encode(json.dumps(
                {"rv": rv, "id": self.page_seq}).encode()).decode()

    def take_pages(self, token):
        """(rv, the items left) for a continue token; None when expired."""
        try:
            t = json.loads(base64.urlsafe_b64decode(token.encode()))
            rv, key = int(t["rv"]), int(t["id"])
        except (ValueError, KeyError, TypeError):
            raise ApiError(400, "BadRequest", "invalid continue token")
        with self.lock:
            kept = self.pages.pop(key, None)
            expired = kept is None or rv < self.compacted_rv or self.expire_pages
            return None if expired else kept

    def all(self, plural):
        return self.list(plural, None, lambda l: True, lambda o: True)[0]

    def compact(self):
        """Forgets all history: every resourceVersion handed out so far is
        too old, so watches get 410 Gone and clients must relist."""
        with self.lock:
            self.rv += 1
            self.compacted_rv = self.rv
            self.history = []
            self.lock.notify_all()

    def drop_watches(self):
        with self.lock:
            self.watch_generation += 1
            self.lock.notify_all()

    def dump(self, kubelet):
        with self.lock:
            return {"rv": self.rv, "kubelet": kubelet,
                    "objects": [[[plural, ns, name], o] for plural, t in self.kinds.items()
                                for (ns, name), o in t.items()]}

    def load(self, data):
        self.rv = data["rv"]
        self.compacted_rv = self.rv
        for (plural, ns, name), o in data["objects"]:
            self._table(plural)[(ns, name)] = o
        return data.get("kubelet") or {}


# --- helpers over objects ------------------------------------------------------

def meta(o):
    return o["metadata"]


def owner_ref(owner):
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"],
            "name": meta(owner)["name"], "uid": meta(owner)["uid"], "controller": True,
            "blockOwnerDeletion": True}


def controller_uid(o):
    return next((r.get("uid") for r in meta(o).get("ownerReferences") or []
                 if r.get("controller")), None)


def get_condition(o, ctype):
    return next((c for c in (o.get("status") or {}).get("conditions") or []
                 if c.get("type") == ctype), None)


def pod_ready(p):
    c = get_condition(p, "Ready")
    return bool(c and c.get("status") == "True")


def terminating(o):
    return "deletionTimestamp" in meta(o)


def pod_active(p):
    return not terminating(p) and (p.get("status") or {}).get("phase") not in ("Succeeded",
                                                                                 "Failed")


def iso_to_epoch(s):
    try:
        return calendar.timegm(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ"))
    except (TypeError, ValueError):
        return 0.0


def pod_available(p, min_ready_s):
    if not pod_ready(p):
        return False
    if not min_ready_s:
        return True
    since = iso_to_epoch(get_condition(p, "Ready").get("lastTransitionTime"))
    return time.time() - since >= min_ready_s


def set_condition(conds, ctype, status, reason=None, message=None, extra_times=()):
    """Sets a condition the way controllers do: lastTransitionTime moves only
    when the status does; an identical status and reason leave it as is."""
    now = now_iso()
    cur = next((c for c in conds if c.get("type") == ctype), None)
    if cur and cur.get("status") == status and cur.get("reason") == reason and \
            cur.get("message") == message:
        return False
    new = {"type": ctype, "status": status}
    for t in extra_times:
        new[t] = now
    new["lastTransitionTime"] = (cur["lastTransitionTime"] if cur and
                                 cur.get("status") == status else now)
    if reason is not None:
        new["reason"] = reason
    if message is not None:
        new["message"] = message
    if cur:
        conds[conds.index(cur)] = new
    else:
        conds.append(new)
    return True


def container_requests(c):
    res = c.get("resources") or {}
    req = dict(res.get("limits") or {})
    req.update(res.get("requests") or {})
    out = {}
    for k, v in req.items():
        try:
            out[k] = quantity(v)
        except ValueError:
            pass
    return out


def pod_requests(spec):
    """What the scheduler counts for a pod: the sum over its containers, or
    the largest init container's when larger."""
    total = {}
    for c in spec.get("containers") or []:
        for r, q in container_requests(c).items():
            total[r] = total.get(r, 0) + q
    for c in spec.get("initContainers") or []:
        for r, q in container_requests(c).items():
            total[r] = max(total.get(r, 0), q)
    return total


def qos_class(spec):
    cs = spec.get("containers") or []
    reqs = [c.get("resources", {}).get("requests") or {} for c in cs]
    lims = [c.get("resources", {}).get("limits") or {} for c in cs]
    if not any(("cpu" in r or "memory" in r) for r in reqs + lims):
        return "BestEffort"
    if all(all(k in lim and str(req.get(k)) == str(lim[k]) for k in ("cpu", "memory"))
           for req, lim in zip(reqs, lims)):
        return "Guaranteed"
    return "Burstable"


def fnv1a32(data):
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def pod_template_hash(template, collision_count=0):
    """FNV-1a of the template (and the collision count), its decimal form
    spelled in the safe alphabet, as the Deployment controller names its
    ReplicaSets."""
    data = json.dumps(template, sort_keys=True, separators=(",", ":")).encode()
    if collision_count:
        data += int(collision_count).to_bytes(4, "little")
    return "".join(SAFE_CHARS[b % len(SAFE_CHARS)] for b in str(fnv1a32(data)).encode())


def without_hash(template):
    t = copy.deepcopy(template)
    labels = (t.get("metadata") or {}).get("labels")
    if labels:
        labels.pop("pod-template-hash", None)
    return t


def revision(rs):
    try:
        return int((meta(rs).get("annotations") or {}).get("deployment.kubernetes.io/revision",
                                                            0))
    except ValueError:
        return 0


def replicas(o):
    return int(o.get("spec", {}).get("replicas") or 0)


def st(o, field):
    return int((o.get("status") or {}).get(field) or 0)


def created(o):
    return (meta(o).get("creationTimestamp", ""), meta(o)["name"])


def omit_zero(d, keep=()):
    return {k: v for k, v in d.items() if v or k in keep}


def tolerates(tol, taint):
    if tol.get("effect") and tol["effect"] != taint.get("effect"):
        return False
    op = tol.get("operator") or "Equal"
    if not tol.get("key"):
        return op == "Exists"  # an empty key with Exists tolerates everything
    if tol["key"] != taint.get("key"):
        return False
    return op == "Exists" or (tol.get("value") or "") == (taint.get("value") or "")


def node_affinity_matches(spec, node):
    labels = meta(node).get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    req = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if not req:
        return True
    fields = {"metadata.name": meta(node)["name"]}

    def term(t):
        exprs, fexprs = t.get("matchExpressions") or [], t.get("matchFields") or []
        if not exprs and not fexprs:
            return False  # an empty term selects no node
        return (all(_expression_matches(labels, e.get("key"), e.get("operator"),
                                        e.get("values") or []) for e in exprs) and
                all(_expression_matches(fields, e.get("key"), e.get("operator"),
                                        e.get("values") or []) for e in fexprs))
    return any(term(t) for t in req.get("nodeSelectorTerms") or [])


def histogram_message(n_nodes, reasons):
    counts = {}
    for r in reasons:
        counts[r] = counts.get(r, 0) + 1
    return f"0/{n_nodes} nodes are available: " + ", ".join(
        sorted(f"{v} {k}" for k, v in counts.items())) + "."


def fit_error(n_nodes, failures):
    """The scheduler's FitError message, then its preemption PostFilter's:
    every pod here has priority 0, so there is never a victim to preempt."""
    if n_nodes == 0:
        return "no nodes available to schedule pods"
    msg = histogram_message(n_nodes, [r for reasons, _ in failures for r in reasons])
    pre = histogram_message(n_nodes, ["Preemption is not helpful for scheduling" if unresolvable
                                      else "No preemption victims found for incoming pod"
                                      for _, unresolvable in failures])
    return f"{msg} preemption: {pre}"


def parse_taint(t):
    if isinstance(t, dict):
        return {k: v for k, v in t.items() if k in ("key", "value", "effect")}
    m = re.fullmatch(r"([^=:]+)(?:=([^:]*))?:(NoSchedule|PreferNoSchedule|NoExecute)", t)
    if not m:
        raise SystemExit(f"kube-sim: --nodes: bad taint {t!r} (want key[=value]:Effect)")
    out = {"key": m.group(1), "effect": m.group(3)}
    if m.group(2):
        out["value"] = m.group(2)
    return out


def make_node(n):
    """A Node object from one --nodes entry."""
    gpus = n.get("gpus", 1) * n.get("replicas", 1)
    alloc = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "500Gi",
             "nvidia.com/gpu": str(gpus)}
    alloc.update({k: str(v) for k, v in (n.get("allocatable") or {}).items()})
    cap = dict(alloc)
    cap.update({k: str(v) for k, v in (n.get("capacity") or {}).items()})
    labels = {"kubernetes.io/hostname": n["name"], "kubernetes.io/os": "linux",
              "kubernetes.io/arch": "amd64", "nvidia.com/gpu.count": str(n.get("gpus", 1)),
              "nvidia.com/gpu.replicas": str(n.get("replicas", 1)),
              "nvidia.com/gpu.product": n.get("product", "NVIDIA-A100-SXM4-80GB")}
    labels.update(n.get("labels") or {})
    spec = {}
    if n.get("taints"):
        spec["taints"] = [parse_taint(t) for t in n["taints"]]
    if n.get("unschedulable"):
        spec["unschedulable"] = True
    now = now_iso()
    return {"metadata": {"name": n["name"], "labels": labels},
            "spec": spec,
            "status": {"capacity": cap, "allocatable": alloc,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "kubelet is posting ready status",
                                       "lastHeartbeatTime": now, "lastTransitionTime": now}],
                       "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                     {"type": "Hostname", "address": n["name"]}],
                       "nodeInfo": {"architecture": "amd64", "bootID": str(uuid.uuid4()),
                                    "containerRuntimeVersion": "sim://1",
                                    "kernelVersion": os.uname().release,
                                    "kubeProxyVersion": "v1.32.0-kube-sim",
                                    "kubeletVersion": "v1.32.0-kube-sim",
                                    "machineID": uuid.uuid4().hex, "operatingSystem": "linux",
                                    "osImage": "kube-sim", "systemUUID": str(uuid.uuid4())}}}


# --- the kubelet's containers and probes ------------------------------------------

class ProbeWorker:
    """One probe of one container, run as the kubelet's probe worker runs it:
    once when the container starts and then on a ticker of periodSeconds;
    successThreshold/failureThreshold consecutive results change the result."""

    def __init__(self, kind, spec, period_override_s, now, result=None):
        self.kind, self.spec = kind, spec
        self.period = period_override_s or spec.get("periodSeconds") or 10
        self.next_tick = now  # the first run is at once
        self.pending = None  # a probe in flight (a Future)
        self.result = result  # None: no result yet
        self.last, self.run = None, 0
        self.trigger = False  # run at once (readiness after the startup probe succeeds)

    def due(self, now):
        return self.pending is None and (self.trigger or now >= self.next_tick)

    def begin(self, container, now):
        """Returns whether to probe now (else this run was a no-op)."""
        self.trigger = False
        while self.next_tick <= now:
            self.next_tick += self.period
        if self.result is None:  # the worker's initial value
            self.result = {"readiness": False, "liveness": True, "startup": False}[self.kind]
        if now - container.started_mono < self.spec.get("initialDelaySeconds", 0):
            return False
        if (self.kind == "startup") == container.started:
            return False  # startup probes until started, the others after
        return True

    def finish(self, ok):
        """Returns the new result when it changes, else None."""
        if ok == self.last:
            self.run += 1
        else:
            self.last, self.run = ok, 1
        if (not ok and self.run < self.spec.get("failureThreshold", 3)) or \
                (ok and self.run < self.spec.get("successThreshold", 1)):
            return None
        if ok == self.result:
            return None
        self.result = ok
        return ok


class Container:
    """What a node's kubelet holds for one pod: its server process (the
    pod's first container), probe workers, restarts."""

    def __init__(self, pod, ip, port):
        self.uid, self.ns, self.name = meta(pod)["uid"], meta(pod)["namespace"], meta(pod)["name"]
        self.ip, self.port = ip, port
        self.proc, self.pid = None, None
        self.restarts = 0
        self.started_mono, self.started_at = time.monotonic(), now_iso()
        self.started = False
        self.workers = {}
        self.waiting = None  # (reason, message) while not running
        self.restart_at = None
        self.last_exit = None
        self.term_at = self.kill_at = None
        self.killed = False
        self.ran = False  # a container has run (the pod's phase stays Running)

    def alive(self):
        if self.proc is not None:
            return self.proc.poll() is None
        return self.pid is not None and pid_alive(self.pid)

    def signal(self, sig):
        try:
            if self.proc is not None:
                if self.proc.poll() is None:
                    self.proc.send_signal(sig)
            elif self.pid:
                os.kill(self.pid, sig)
        except (ProcessLookupError, OSError):
            pass

    def ready(self):
        w = self.workers.get("readiness")
        return (self.waiting is None and self.started and self.alive() and
                (w is None or w.result is True))

    def exit_code(self):
        """As a container runtime reports it: 128 + the signal that ended it."""
        if self.proc is not None and self.proc.returncode is not None:
            rc = self.proc.returncode
            return 128 - rc if rc < 0 else rc
        return 137 if self.killed else 1


def probe(ip, port, p_spec, container_ports):
    """One httpGet/tcpSocket probe, as the kubelet makes it: (success, why not)."""
    timeout = p_spec.get("timeoutSeconds", 1)
    if "httpGet" not in p_spec and "tcpSocket" not in p_spec:
        return True, ""  # exec and grpc probes: the sim has nothing to run them in; they pass
    action = p_spec.get("httpGet") or p_spec.get("tcpSocket")
    target = action.get("port", port)
    if isinstance(target, str) and not target.isdigit():
        if target not in container_ports:
            return False, f"port {target!r} is not a named port of the container"
        target = container_ports[target]
    host = action.get("host") or ip
    scheme = action.get("scheme", "HTTP")
    url = f'{scheme.lower()}://{host}:{target}{action.get("path", "/")}'
    try:
        s = socket.create_connection((host, int(target)), timeout=timeout)
    except OSError as e:
        why = ("connect: connection refused" if isinstance(e, ConnectionRefusedError) else
               "i/o timeout" if isinstance(e, socket.timeout) else str(e))
        dial = f"dial tcp {host}:{target}: {why}"
        return False, dial if "tcpSocket" in p_spec else f'Get "{url}": {dial}'
    try:
        if "tcpSocket" in p_spec:
            return True, ""
        if scheme == "HTTPS":
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            s = ctx.wrap_socket(s, server_hostname=host)
        headers = "".join(f"{h['name']}: {h['value']}\r\n" for h in action.get("httpHeaders") or [])
        s.sendall(f"GET {action.get('path', '/')} HTTP/1.1\r\nHost: {host}:{target}\r\n"
                  f"User-Agent: kube-probe/1.32\r\nAccept: */*\r\n{headers}"
                  "Connection: close\r\n\r\n".encode())
        data = b""
        while b"\r\n" not in data and len(data) < 256:
            chunk = s.recv(256)
            if not chunk:
                break
            data += chunk
        m = re.match(rb"HTTP/1\.[01] (\d{3})", data)
        if not m:
            return False, f'Get "{url}": EOF'
        code = int(m.group(1))
        if 200 <= code < 400:
            return True, ""
        return False, f"HTTP probe failed with statuscode: {code}"
    except socket.timeout:
        return False, (f'Get "{url}": context deadline exceeded '
                       "(Client.Timeout exceeded while awaiting headers)")
    except OSError as e:
        return False, f'Get "{url}": {e}'
    finally:
        s.close()


# --- the cluster ----------------------------------------------------------------

class Cluster:
    """The controllers, the scheduler and the nodes' kubelets."""

    def __init__(self, store, args):
        self.store = store
        self.args = args
        self.containers = {}  # pod uid -> Container
        self.events = {}  # (namespace, uid, reason, message, component) -> Event name
        self.probes = concurrent.futures.ThreadPoolExecutor(max_workers=16)
        self.ip_next = 0
        self.pulls = {}  # pod uid -> when its image pull ends (monotonic)
        self.first_seen = {}  # pod uid -> when the scheduler first saw it (monotonic)
        self.seen_rv = None
        self.next_full = 0.0
        self.stop = False

    def start(self):
        threading.Thread(target=self.loop, daemon=True).start()

    def event(self, obj, etype, reason, message, component):
        """Records an Event on obj as the components do: one per (object,
        reason, message, component), counted when it happens again."""
        md = meta(obj)
        ns = md.get("namespace") or "default"
        key = (ns, md["uid"], reason, message, component)
        now = now_iso()
        name = self.events.get(key)
        if name and self.store.mutate("events", ns, name, lambda e: e.update(
                count=e.get("count", 1) + 1, lastTimestamp=now)):
            return
        source = {"component": component}
        if component == "kubelet" and obj.get("spec", {}).get("nodeName"):
            source["host"] = obj["spec"]["nodeName"]
        ev = {"metadata": {"name": f"{md['name']}.{time.time_ns():x}", "namespace": ns},
              "involvedObject": {"kind": obj.get("kind"), "namespace": ns, "name": md["name"],
                                 "uid": md["uid"], "apiVersion": obj.get("apiVersion"),
                                 "resourceVersion": md.get("resourceVersion")},
              "reason": reason, "message": message, "source": source,
              "firstTimestamp": now, "lastTimestamp": now, "count": 1, "type": etype,
              "eventTime": None, "reportingComponent": component,
              "reportingInstance": source.get("host", "")}
        try:
            made = self.store.create("events", ev, "Event", "v1")
        except ApiError:
            return
        if len(self.events) > 10000:
            self.events.clear()
        self.events[key] = made["metadata"]["name"]

    def loop(self):
        while not self.stop:
            try:
                self.reconcile()
            except Exception as e:  # keep simulating; report
                import traceback
                traceback.print_exc()
                print(f"kube-sim: reconcile error: {e!r}", file=sys.stderr)
            time.sleep(self.args.tick_ms / 1000)

    def reconcile(self):
        rv = self.store.rv
        now = time.monotonic()
        full = rv != self.seen_rv or now >= self.next_full
        if full:
            # Level-triggered: a full pass whenever anything changed (and each
            # second, for the time-driven parts).
            self.seen_rv, self.next_full = rv, now + 1.0
            nodes = self.store.all("nodes")
            self.node_lifecycle(nodes)
            self.collect_garbage()
            owned = self.by_controller(self.store.all("replicasets"))
            pods_of = self.by_controller(self.store.all("pods"))
            for d in self.store.all("deployments"):
                self.sync_deployment(d, owned.get(meta(d)["uid"], []), pods_of)
            for rs in self.store.all("replicasets"):
                self.sync_replicaset(rs, pods_of.get(meta(rs)["uid"], []))
            self.schedule(self.store.all("nodes"), self.store.all("pods"))
        self.kubelet(self.store.all("pods"), {meta(n)["name"] for n in self.store.all("nodes")})
        if full or rv != self.store.rv:
            self.sync_endpointslices(self.store.all("services"), self.store.all("pods"),
                                     self.store.all("endpointslices"), nodes=None)

    @staticmethod
    def by_controller(objs):
        out = {}
        for o in objs:
            uid = controller_uid(o)
            if uid:
                out.setdefault(uid, []).append(o)
        return out

    # -- node lifecycle --
    def node_lifecycle(self, nodes):
        """A cordoned node carries the unschedulable NoSchedule taint."""
        for n in nodes:
            taints = n.get("spec", {}).get("taints") or []
            has = any(t.get("key") == UNSCHEDULABLE_TAINT for t in taints)
            want = bool(n.get("spec", {}).get("unschedulable"))
            if has == want:
                continue

            def fix(o, want=want):
                ts = [t for t in o["spec"].get("taints") or [] if t.get("key") != UNSCHEDULABLE_TAINT]
                if want:
                    ts.append({"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule",
                               "timeAdded": now_iso()})
                if ts:
                    o["spec"]["taints"] = ts
                else:
                    o["spec"].pop("taints", None)
            self.store.mutate("nodes", "", meta(n)["name"], fix)

    # -- garbage collector --
    def collect_garbage(self):
        with self.store.lock:
            uids = {meta(o)["uid"] for t in self.store.kinds.values() for o in t.values()}
        for plural in ("replicasets", "pods", "endpointslices", "services", "events", "leases"):
            for o in self.store.all(plural):
                refs = meta(o).get("ownerReferences") or []
                if refs and not any(r.get("uid") in uids for r in refs):
                    self.delete_object(plural, o)

    def delete_object(self, plural, o, grace=None):
        md = meta(o)
        try:
            if plural == "pods":
                begin_pod_deletion(self.store, md["namespace"], md["name"], grace)
            else:
                self.store.delete(plural, md.get("namespace", ""), md["name"], md["uid"])
        except ApiError:
            pass

    # -- deployment controller --
    def max_surge(self, d):
        s = d["spec"].get("strategy") or {}
        if s.get("type") != "RollingUpdate":
            return 0
        return self.fenceposts(d)[0]

    def max_unavailable(self, d):
        s = d["spec"].get("strategy") or {}
        if s.get("type") != "RollingUpdate" or replicas(d) == 0:
            return 0
        return min(self.fenceposts(d)[1], replicas(d))

    def fenceposts(self, d):
        ru = d["spec"]["strategy"].get("rollingUpdate") or {}
        want = replicas(d)
        surge = int_or_percent(ru.get("maxSurge", "25%"), want, True)
        unavail = int_or_percent(ru.get("maxUnavailable", "25%"), want, False)
        if surge == 0 and unavail == 0:
            unavail = 1  # a rollout must be able to make progress
        return surge, unavail

    def scale_rs(self, rs, n, d):
        """Scales a ReplicaSet, noting the Deployment's size on it as the
        controller does (desired-replicas, max-replicas)."""
        anns = {"deployment.kubernetes.io/desired-replicas": str(replicas(d)),
                "deployment.kubernetes.io/max-replicas": str(replicas(d) + self.max_surge(d))}
        cur = meta(rs).setdefault("annotations", {})
        if replicas(rs) == n and all(cur.get(k) == v for k, v in anns.items()):
            return False
        changed = replicas(rs) != n

        def fn(o):
            o["spec"]["replicas"] = n
            o["metadata"].setdefault("annotations", {}).update(anns)
        self.store.mutate("replicasets", meta(rs)["namespace"], meta(rs)["name"], fn)
        if changed:
            self.event(d, "Normal", "ScalingReplicaSet",
                       f"Scaled {'up' if n > replicas(rs) else 'down'} replica set "
                       f"{meta(rs)['name']} to {n} from {replicas(rs)}", "deployment-controller")
        rs["spec"]["replicas"] = n
        cur.update(anns)
        return changed

    def sync_deployment(self, d, rss, pods_of):
        """rss: the ReplicaSets the Deployment controls; pods_of: pods by
        their controller's uid."""
        if terminating(d):
            return
        tpl = d["spec"].get("template") or {}
        same = sorted((rs for rs in rss if without_hash(rs["spec"].get("template")) == tpl),
                      key=created)
        new_rs = same[0] if same else None
        old = sorted((rs for rs in rss if rs is not new_rs), key=created)
        self.progress_note = None
        if new_rs is not None:
            self.sync_revision(d, new_rs, old)
        if d["spec"].get("paused") or self.is_scaling_event(d, new_rs, old):
            self.scale(d, new_rs, old)
            if new_rs is not None and self.complete(d, new_rs, old):
                self.cleanup(d, old)
        elif d["spec"]["strategy"].get("type") == "Recreate":
            new_rs = self.rollout_recreate(d, new_rs, old, pods_of)
        else:
            new_rs = self.rollout_rolling(d, new_rs, old)
        self.sync_status(d, new_rs, old)

    def sync_revision(self, d, new_rs, old):
        want = max([revision(rs) for rs in old] + [0]) + 1
        if revision(new_rs) < want:
            self.store.mutate("replicasets", meta(new_rs)["namespace"], meta(new_rs)["name"],
                              lambda o: o["metadata"].setdefault("annotations", {}).update(
                                  {"deployment.kubernetes.io/revision": str(want)}))
            meta(new_rs).setdefault("annotations", {})["deployment.kubernetes.io/revision"] = \
                str(want)
        if not get_condition(d, "Progressing") and d["spec"].get("progressDeadlineSeconds"):
            self.progress_note = ("FoundNewReplicaSet", f'Found new replica set "{meta(new_rs)["name"]}"')

    def is_scaling_event(self, d, new_rs, old):
        for rs in old + ([new_rs] if new_rs else []):
            if replicas(rs) > 0:
                want = (meta(rs).get("annotations") or {}).get(
                    "deployment.kubernetes.io/desired-replicas")
                if want is not None and want != str(replicas(d)):
                    return True
        return False

    def scale(self, d, new_rs, old):
        """A change of spec.replicas alone: the one active ReplicaSet takes
        it, or the active ones share it in proportion to their sizes."""
        every = ([new_rs] if new_rs else []) + old
        active = [rs for rs in every if replicas(rs) > 0]
        if not every:
            return
        if len(active) <= 1:
            target = active[0] if active else (new_rs or sorted(old, key=created)[-1])
            self.scale_rs(target, replicas(d), d)
            return
        if new_rs is not None and replicas(new_rs) == replicas(d) and \
                st(new_rs, "availableReplicas") == replicas(d):
            for rs in active:
                if rs is not new_rs:
                    self.scale_rs(rs, 0, d)
            return
        allowed = replicas(d) + self.max_surge(d) if replicas(d) > 0 else 0
        to_add = allowed - sum(replicas(rs) for rs in active)
        # Larger first; newer first when adding, older first when removing.
        active.sort(key=created, reverse=to_add > 0)
        active.sort(key=lambda rs: -replicas(rs))
        added, sizes = 0, {}
        for rs in active:
            prop = 0
            if to_add != 0 and to_add != added and replicas(rs) > 0:
                if replicas(d) == 0:
                    frac = -replicas(rs)
                else:
                    annotated = int((meta(rs).get("annotations") or {}).get(
                        "deployment.kubernetes.io/max-replicas", 0) or st(d, "replicas") or 1)
                    size = replicas(rs) * (replicas(d) + self.max_surge(d)) / annotated
                    frac = int(math.floor(size + 0.5)) - replicas(rs)
                allowed_left = to_add - added
                prop = min(frac, allowed_left) if to_add > 0 else max(frac, allowed_left)
            sizes[meta(rs)["name"]] = replicas(rs) + prop
            added += prop
        if to_add != 0:
            first = meta(active[0])["name"]
            sizes[first] = max(0, sizes[first] + to_add - added)
        for rs in active:
            self.scale_rs(rs, sizes[meta(rs)["name"]], d)

    def new_rs_replicas(self, d, all_rss, new_rs):
        if d["spec"]["strategy"].get("type") != "RollingUpdate":
            return replicas(d)
        current = sum(replicas(rs) for rs in all_rss)
        max_total = replicas(d) + self.max_surge(d)
        have = replicas(new_rs) if new_rs else 0
        if current >= max_total:
            return have
        return have + min(max_total - current, replicas(d) - have)

    def create_new_rs(self, d, old):
        md = meta(d)
        tpl = copy.deepcopy(d["spec"]["template"])
        collisions = st(d, "collisionCount")
        h = pod_template_hash(tpl, collisions)
        tpl.setdefault("metadata", {}).setdefault("labels", {})["pod-template-hash"] = h
        sel = copy.deepcopy(d["spec"]["selector"])
        sel.setdefault("matchLabels", {})["pod-template-hash"] = h
        anns = {k: v for k, v in (md.get("annotations") or {}).items()
                if k != "kubectl.kubernetes.io/last-applied-configuration"
                and not k.startswith("deployment.kubernetes.io/")}
        anns.update({"deployment.kubernetes.io/revision":
                     str(max([revision(rs) for rs in old] + [0]) + 1),
                     "deployment.kubernetes.io/desired-replicas": str(replicas(d)),
                     "deployment.kubernetes.io/max-replicas":
                         str(replicas(d) + self.max_surge(d))})
        rs = {"metadata": {"name": f"{md['name']}-{h}", "namespace": md["namespace"],
                           "labels": dict(tpl["metadata"]["labels"]), "annotations": anns,
                           "ownerReferences": [owner_ref(d)]},
              "spec": {"replicas": self.new_rs_replicas(d, old, None),
                       "minReadySeconds": d["spec"].get("minReadySeconds", 0),
                       "selector": sel, "template": tpl},
              "status": {"replicas": 0}}
        try:
            made = self.store.create("replicasets", rs, "ReplicaSet", "apps/v1")
        except ApiError:
            # A ReplicaSet of that name with another template: count the
            # collision so that the next hash differs.
            self.store.mutate("deployments", md["namespace"], md["name"],
                              lambda o: o.setdefault("status", {}).update(
                                  {"collisionCount": collisions + 1}))
            return None
        self.progress_note = ("NewReplicaSetCreated", f'Created new replica set "{meta(made)["name"]}"')
        if replicas(made):
            self.event(d, "Normal", "ScalingReplicaSet", f"Scaled up replica set "
                       f"{meta(made)['name']} to {replicas(made)} from 0", "deployment-controller")
        return made

    def rollout_rolling(self, d, new_rs, old):
        if new_rs is None:
            new_rs = self.create_new_rs(d, old)
            if new_rs is None:
                return None
        every = old + [new_rs]
        # Scale the new ReplicaSet up within maxSurge...
        if replicas(new_rs) > replicas(d):
            self.scale_rs(new_rs, replicas(d), d)
            return new_rs
        if replicas(new_rs) < replicas(d):
            if self.scale_rs(new_rs, self.new_rs_replicas(d, every, new_rs), d):
                return new_rs
        # ... and the old ones down within maxUnavailable.
        active_old = [rs for rs in old if replicas(rs) > 0]
        if active_old and self.scale_down_old(d, every, active_old, new_rs):
            return new_rs
        if self.complete(d, new_rs, old):
            self.cleanup(d, old)
        return new_rs

    def scale_down_old(self, d, every, old, new_rs):
        all_pods = sum(replicas(rs) for rs in every)
        min_available = replicas(d) - self.max_unavailable(d)
        new_unavailable = replicas(new_rs) - st(new_rs, "availableReplicas")
        max_down = all_pods - min_available - new_unavailable
        if max_down <= 0:
            return False
        done = 0
        for rs in sorted(old, key=created):  # unhealthy replicas first
            if done >= max_down:
                break
            unhealthy = replicas(rs) - st(rs, "availableReplicas")
            if replicas(rs) == 0 or unhealthy <= 0:
                continue
            n = min(max_down - done, unhealthy)
            self.scale_rs(rs, replicas(rs) - n, d)
            done += n
        available = sum(st(rs, "availableReplicas") for rs in every)
        if available > min_available:
            budget, down = available - min_available, 0
            for rs in sorted(old, key=created):
                if down >= budget:
                    break
                if replicas(rs) == 0:
                    continue
                n = min(replicas(rs), budget - down)
                self.scale_rs(rs, replicas(rs) - n, d)
                down += n
            done += down
        return done > 0

    def rollout_recreate(self, d, new_rs, old, pods_of):
        """Every old pod gone before the new ReplicaSet scales up."""
        scaled = False
        for rs in old:
            if replicas(rs) > 0:
                scaled |= self.scale_rs(rs, 0, d)
        if scaled:
            return new_rs
        if any((p.get("status") or {}).get("phase") not in ("Failed", "Succeeded")
               for rs in old for p in pods_of.get(meta(rs)["uid"], [])):
            return new_rs
        if new_rs is None:
            return self.create_new_rs(d, old)
        if replicas(new_rs) != replicas(d):
            self.scale_rs(new_rs, replicas(d), d)
        elif self.complete(d, new_rs, old):
            self.cleanup(d, old)
        return new_rs

    def complete(self, d, new_rs, old):
        want = replicas(d)
        every = old + [new_rs]
        return (st(new_rs, "replicas") == want and
                sum(st(rs, "replicas") for rs in every) == want and
                sum(st(rs, "availableReplicas") for rs in every) == want)

    def cleanup(self, d, old):
        """Old ReplicaSets beyond spec.revisionHistoryLimit go."""
        limit = d["spec"].get("revisionHistoryLimit", 10)
        idle = sorted((rs for rs in old if replicas(rs) == 0 and st(rs, "replicas") == 0
                       and not terminating(rs)), key=revision)
        for rs in idle[:max(0, len(idle) - limit)]:
            self.delete_object("replicasets", rs)

    def sync_status(self, d, new_rs, old):
        every = old + ([new_rs] if new_rs else [])
        want = replicas(d)
        available = sum(st(rs, "availableReplicas") for rs in every)
        unavailable = max(0, sum(replicas(rs) for rs in every) - available)
        status = omit_zero({
            "observedGeneration": meta(d)["generation"],
            "replicas": sum(st(rs, "replicas") for rs in every),
            "updatedReplicas": st(new_rs, "replicas") if new_rs else 0,
            "readyReplicas": sum(st(rs, "readyReplicas") for rs in every),
            "availableReplicas": available, "unavailableReplicas": unavailable,
            "collisionCount": st(d, "collisionCount")})
        old_status = d.get("status") or {}
        conds = copy.deepcopy(old_status.get("conditions") or [])
        times = ("lastUpdateTime",)
        if available >= want - self.max_unavailable(d):
            set_condition(conds, "Available", "True", "MinimumReplicasAvailable",
                          "Deployment has minimum availability.", times)
        else:
            set_condition(conds, "Available", "False", "MinimumReplicasUnavailable",
                          "Deployment does not have minimum availability.", times)
        if self.progress_note:
            set_condition(conds, "Progressing", "True", *self.progress_note, extra_times=times)
        prog = next((c for c in conds if c["type"] == "Progressing"), None)
        what = f'ReplicaSet "{meta(new_rs)["name"]}"' if new_rs else f'Deployment "{meta(d)["name"]}"'
        done = (prog is not None and prog.get("reason") == "NewReplicaSetAvailable" and
                status.get("replicas", 0) == status.get("updatedReplicas", 0))
        if d["spec"].get("progressDeadlineSeconds") and not done:
            if (status.get("updatedReplicas", 0) == want and status.get("replicas", 0) == want
                    and available == want):
                set_condition(conds, "Progressing", "True", "NewReplicaSetAvailable",
                              f"{what} has successfully progressed.", times)
            elif (status.get("updatedReplicas", 0) > st(d, "updatedReplicas") or
                  status.get("replicas", 0) - status.get("updatedReplicas", 0) <
                  st(d, "replicas") - st(d, "updatedReplicas") or
                  status.get("readyReplicas", 0) > st(d, "readyReplicas") or
                  available > st(d, "availableReplicas")):
                now = now_iso()
                new = {"type": "Progressing", "status": "True", "lastUpdateTime": now,
                       "lastTransitionTime": prog["lastTransitionTime"] if prog and
                       prog["status"] == "True" else now,
                       "reason": "ReplicaSetUpdated", "message": f"{what} is progressing."}
                conds = [c for c in conds if c["type"] != "Progressing"] + [new]
            elif prog is not None and prog.get("reason") != "ProgressDeadlineExceeded" and \
                    iso_to_epoch(prog.get("lastUpdateTime")) + \
                    d["spec"]["progressDeadlineSeconds"] < time.time():
                set_condition(conds, "Progressing", "False", "ProgressDeadlineExceeded",
                              f"{what} has timed out progressing.", times)
        status["conditions"] = conds
        if new_rs is not None:
            rev = str(revision(new_rs))
        else:
            rev = None
        anns = meta(d).get("annotations") or {}
        if status == old_status and (rev is None or anns.get("deployment.kubernetes.io/revision")
                                     == rev):
            return

        def fn(o):
            o["status"] = status
            if rev is not None:
                o["metadata"].setdefault("annotations", {})["deployment.kubernetes.io/revision"] = rev
        self.store.mutate("deployments", meta(d)["namespace"], meta(d)["name"], fn)

    # -- replicaset controller --
    def sync_replicaset(self, rs, mine):
        """mine: the pods the ReplicaSet controls."""
        md = meta(rs)
        if terminating(rs):
            return
        active = [p for p in mine if pod_active(p)]
        diff = len(active) - replicas(rs)
        if diff < 0:
            for _ in range(min(-diff, 500)):
                made = self.create_pod(rs)
                self.event(rs, "Normal", "SuccessfulCreate", f"Created pod: {meta(made)['name']}",
                           "replicaset-controller")
        elif diff > 0:
            for p in sorted(active, key=self.deletion_rank(active))[:diff]:
                self.delete_object("pods", p)
                self.event(rs, "Normal", "SuccessfulDelete", f"Deleted pod: {meta(p)['name']}",
                           "replicaset-controller")
        tpl_labels = (rs["spec"].get("template", {}).get("metadata") or {}).get("labels") or {}
        min_ready = rs["spec"].get("minReadySeconds", 0)
        status = omit_zero({
            "replicas": len(active),
            "fullyLabeledReplicas": sum(1 for p in active if all(
                (meta(p).get("labels") or {}).get(k) == v for k, v in tpl_labels.items())),
            "readyReplicas": sum(1 for p in active if pod_ready(p)),
            "availableReplicas": sum(1 for p in active if pod_available(p, min_ready)),
            "observedGeneration": md["generation"]}, keep=("replicas",))
        conds = (rs.get("status") or {}).get("conditions")
        if conds:
            status["conditions"] = conds
        if status != rs.get("status"):
            self.store.mutate("replicasets", md["namespace"], md["name"],
                              lambda o: o.__setitem__("status", status))

    @staticmethod
    def deletion_rank(pods):
        """The ReplicaSet controller's order for scale-down: unscheduled,
        pending, not ready, lower deletion cost, crowded nodes, ready the
        shortest, restarted the most, newest first."""
        per_node = {}
        for p in pods:
            node = p["spec"].get("nodeName")
            per_node[node] = per_node.get(node, 0) + 1

        def key(p):
            s = p.get("status") or {}
            ready = pod_ready(p)
            try:
                cost = int((meta(p).get("annotations") or {}).get(
                    "controller.kubernetes.io/pod-deletion-cost", 0))
            except ValueError:
                cost = 0
            ready_since = iso_to_epoch(get_condition(p, "Ready").get(
                "lastTransitionTime")) if ready else 0
            restarts = max([c.get("restartCount", 0) for c in s.get("containerStatuses") or []]
                           + [0])
            return (1 if p["spec"].get("nodeName") else 0,
                    {"Pending": 0, "Unknown": 1, "Running": 2}.get(s.get("phase"), 0),
                    1 if ready else 0, cost,
                    -per_node.get(p["spec"].get("nodeName"), 0),
                    -ready_since, -restarts,
                    tuple(-ord(c) for c in meta(p).get("creationTimestamp", "")),
                    meta(p)["name"])
        return key

    def create_pod(self, rs):
        tpl = copy.deepcopy(rs["spec"].get("template") or {})
        tmeta = tpl.get("metadata") or {}
        spec = tpl.get("spec") or {}
        default_pod_spec(spec, [])
        pod = {"metadata": {"generateName": meta(rs)["name"] + "-",
                            "namespace": meta(rs)["namespace"],
                            "labels": dict(tmeta.get("labels") or {}),
                            "ownerReferences": [owner_ref(rs)]},
               "spec": spec,
               "status": {"phase": "Pending", "qosClass": qos_class(spec)}}
        if tmeta.get("annotations"):
            pod["metadata"]["annotations"] = dict(tmeta["annotations"])
        return self.store.create("pods", pod, "Pod", "v1")

    # -- scheduler --
    def schedule(self, nodes, pods):
        pending = [p for p in pods if not p["spec"].get("nodeName") and not terminating(p)
                   and (p.get("status") or {}).get("phase", "Pending") == "Pending"
                   and p["spec"].get("schedulerName", "default-scheduler") == "default-scheduler"]
        if not pending:
            return
        used = {meta(n)["name"]: ({}, 0) for n in nodes}
        for p in pods:
            node = p["spec"].get("nodeName")
            if node in used and (p.get("status") or {}).get("phase") not in ("Succeeded",
                                                                              "Failed"):
                req, count = used[node]
                for r, q in pod_requests(p["spec"]).items():
                    req[r] = req.get(r, 0) + q
                used[node] = (req, count + 1)
        pending.sort(key=lambda p: (-int(p["spec"].get("priority") or 0), created(p)))
        now = time.monotonic()
        for p in pending:
            if not self.scheduler_reached(p, now):
                continue
            want = pod_requests(p["spec"])
            fits, failures = [], []
            for n in nodes:
                reasons, unresolvable = self.filter_node(p, want, n, used[meta(n)["name"]])
                if reasons:
                    failures.append((reasons, unresolvable))
                else:
                    fits.append(n)
            if fits:
                node = min(fits, key=lambda n: (self.allocated_score(want, n,
                                                                     used[meta(n)["name"]][0]),
                                                meta(n)["name"]))
                name = meta(node)["name"]
                req, count = used[name]
                for r, q in want.items():
                    req[r] = req.get(r, 0) + q
                used[name] = (req, count + 1)
                self.bind(p, name)
            else:
                self.mark_unschedulable(p, fit_error(len(nodes), failures))

    def scheduler_reached(self, p, now):
        """sim.thaw.dev/schedule-delay-ms: the pod waits in the scheduler's
        queue that long after it was first seen."""
        anns = meta(p).get("annotations") or {}
        delay = int(anns.get("sim.thaw.dev/schedule-delay-ms", "0") or 0) / 1000
        if delay <= 0:
            return True
        first = self.first_seen.setdefault(meta(p)["uid"], now)
        if now >= first + delay:
            return True
        self.next_full = min(self.next_full, first + delay)  # come back then
        return False

    @staticmethod
    def filter_node(p, want, node, used):
        """The default filter plugins in their order; the first that fails
        names the reasons. Returns (reasons, unresolvable by preemption)."""
        spec = p["spec"]
        tolerations = spec.get("tolerations") or []
        nspec = node.get("spec") or {}
        if nspec.get("unschedulable") and not any(
                tolerates(t, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"})
                for t in tolerations):
            return ["node(s) were unschedulable"], True
        for taint in nspec.get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and \
                    not any(tolerates(t, taint) for t in tolerations):
                return [f"node(s) had untolerated taint {{{taint.get('key')}: "
                        f"{taint.get('value', '')}}}"], True
        if not node_affinity_matches(spec, node):
            return ["node(s) didn't match Pod's node affinity/selector"], True
        alloc = (node.get("status") or {}).get("allocatable") or {}
        req, count = used
        reasons = []
        if count + 1 > int(quantity(alloc.get("pods", "110"))):
            reasons.append("Too many pods")
        for r, q in sorted(want.items()):
            if q <= 0:
                continue
            try:
                have = quantity(alloc.get(r, "0"))
            except ValueError:
                have = 0
            if req.get(r, 0) + q > have:
                reasons.append(f"Insufficient {r}")
        return reasons, False

    @staticmethod
    def allocated_score(want, node, req):
        """Lower is better: the share of the node's resources in use once the
        pod is there (the scheduler's LeastAllocated scoring)."""
        alloc = (node.get("status") or {}).get("allocatable") or {}
        shares = []
        for r in set(want) | {"cpu", "memory"}:
            try:
                have = quantity(alloc.get(r, "0"))
            except ValueError:
                continue
            if have > 0:
                shares.append((req.get(r, 0) + want.get(r, 0)) / have)
        return sum(shares) / len(shares) if shares else 0

    def bind(self, p, node):
        def fn(o):
            if o["spec"].get("nodeName"):
                return
            o["spec"]["nodeName"] = node
            conds = o.setdefault("status", {}).setdefault("conditions", [])
            set_condition(conds, "PodScheduled", "True")
            for c in conds:
                c.setdefault("lastProbeTime", None)
        done = self.store.mutate("pods", meta(p)["namespace"], meta(p)["name"], fn)
        if done and done["spec"].get("nodeName") == node:
            self.event(p, "Normal", "Scheduled", f"Successfully assigned "
                       f"{meta(p)['namespace']}/{meta(p)['name']} to {node}", "default-scheduler")

    def mark_unschedulable(self, p, message):
        cond = get_condition(p, "PodScheduled")
        if cond and cond.get("status") == "False" and cond.get("message") == message:
            return

        def fn(o):
            if o["spec"].get("nodeName"):
                return
            conds = o.setdefault("status", {}).setdefault("conditions", [])
            set_condition(conds, "PodScheduled", "False", "Unschedulable", message)
            for c in conds:
                c.setdefault("lastProbeTime", None)
        done = self.store.mutate("pods", meta(p)["namespace"], meta(p)["name"], fn)
        if done and not done["spec"].get("nodeName"):
            self.event(p, "Warning", "FailedScheduling", message, "default-scheduler")

    # -- kubelet --
    def kubelet(self, pods, nodes):
        """The kubelets of the nodes: each runs the pods bound to it."""
        now = time.monotonic()
        live = set()
        for p in pods:
            live.add(meta(p)["uid"])
            if p["spec"].get("nodeName") and p["spec"]["nodeName"] not in nodes and \
                    not terminating(p):
                continue  # bound to a node that is not there: no kubelet runs it
            try:
                self.kubelet_pod(p, now)
            except ApiError:
                pass
        for uid in [u for u in self.containers if u not in live]:
            c = self.containers.pop(uid)  # force-deleted: nothing waits for it
            c.signal(signal.SIGKILL)
            if c.proc is not None:
                threading.Thread(target=c.proc.wait, daemon=True).start()

    def kubelet_pod(self, p, now):
        md, spec = meta(p), p["spec"]
        c = self.containers.get(md["uid"])
        if terminating(p):
            return self.kill_pod(p, c, now)
        if not spec.get("nodeName") or (p.get("status") or {}).get("phase") in ("Succeeded",
                                                                                 "Failed"):
            return
        if c is None:
            if not self.image_pulled(p, now):
                return
            c = self.containers[md["uid"]] = Container(p, self.alloc_ip(), self.server_port(p))
            self.start_container(p, c, now)
        elif c.waiting and c.restart_at is not None and now >= c.restart_at:
            c.restarts += 1
            self.start_container(p, c, now)
        elif c.waiting is None and not c.alive():
            self.container_died(p, c, now)
        if c.waiting is None:
            self.run_probes(p, c, now)
        self.write_pod_status(p, c)

    def image_pulled(self, p, now):
        """sim.thaw.dev/pull-ms: the kubelet pulls the image first, recording
        Pulling and Pulled as the real kubelet words them; meanwhile the pod
        is Pending with its container waiting in ContainerCreating."""
        md = meta(p)
        ms = int((md.get("annotations") or {}).get("sim.thaw.dev/pull-ms", "0") or 0)
        if ms <= 0:
            return True
        image = ((p["spec"].get("containers") or [{}])[0]).get("image", "")
        done = self.pulls.get(md["uid"])
        if done is None:
            self.pulls[md["uid"]] = now + ms / 1000
            self.event(p, "Normal", "Pulling", f'Pulling image "{image}"', "kubelet")
            self.write_waiting_status(p)
            return False
        if now < done:
            return False
        took = ms / 1000 + (now - done)
        self.event(p, "Normal", "Pulled", f'Successfully pulled image "{image}" in {took:.3f}s '
                   f'({took:.3f}s including waiting). Image size: 4143467520 bytes.', "kubelet")
        del self.pulls[md["uid"]]
        return True

    def write_waiting_status(self, p):
        def fn(o):
            s = o.setdefault("status", {})
            s["phase"] = "Pending"
            s["containerStatuses"] = [
                {"name": ctr.get("name"), "image": ctr.get("image", ""), "imageID": "",
                 "ready": False, "started": False, "restartCount": 0,
                 "state": {"waiting": {"reason": "ContainerCreating"}}, "lastState": {}}
                for ctr in o["spec"].get("containers") or []]
        self.store.mutate("pods", meta(p)["namespace"], meta(p)["name"], fn)

    def start_container(self, p, c, now):
        c.restart_at = None
        c.started_mono, c.started_at = now, now_iso()
        try:
            cmd = self.server_command(p, c.ip, c.port)
        except ValueError as e:
            c.waiting = ("CreateContainerConfigError", str(e))
            return
        try:
            c.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            c.pid = c.proc.pid
        except OSError as e:
            c.waiting = ("RunContainerError", str(e))
            c.restart_at = now + self.backoff(c)
            return
        c.waiting = None
        c.killed = False
        c.ran = True
        ctr = (p["spec"].get("containers") or [{}])[0]
        self.event(p, "Normal", "Started", f"Started container {ctr.get('name')}", "kubelet")
        c.workers = {}
        for kind in ("startup", "readiness", "liveness"):
            pspec = ctr.get(kind + "Probe")
            if isinstance(pspec, dict):
                c.workers[kind] = ProbeWorker(kind, pspec, self.period_override(), now)
        c.started = "startup" not in c.workers

    def period_override(self):
        ms = self.args.kubelet_period_ms
        return ms / 1000 if ms else None

    @staticmethod
    def backoff(c):
        return min(300, 10 * 2 ** c.restarts)

    def container_died(self, p, c, now):
        """The server exited by itself: restarted after the kubelet's back-off."""
        c.last_exit = {"exitCode": c.exit_code(), "reason": "Error" if c.exit_code() else
                       "Completed", "startedAt": c.started_at, "finishedAt": now_iso()}
        ctr = (p["spec"].get("containers") or [{}])[0].get("name")
        c.waiting = ("CrashLoopBackOff", f"back-off {self.backoff(c)}s restarting failed "
                     f"container={ctr} pod={c.name}_{c.ns}({c.uid})")
        c.restart_at = now + self.backoff(c)
        c.started = False
        self.event(p, "Warning", "BackOff", f"Back-off restarting failed container {ctr} in pod "
                   f"{c.name}_{c.ns}({c.uid})", "kubelet")

    def run_probes(self, p, c, now):
        ctr = (p["spec"].get("containers") or [{}])[0]
        named = {port.get("name"): port.get("containerPort") for port in ctr.get("ports") or []
                 if port.get("name")}
        for kind in ("startup", "liveness", "readiness"):
            w = c.workers.get(kind)
            if w is None:
                continue
            if w.pending is not None and w.pending.done():
                ok, why = w.pending.result()
                w.pending = None
                if not ok:
                    self.event(p, "Warning", "Unhealthy",
                               f"{kind.capitalize()} probe failed: {why}", "kubelet")
                changed = w.finish(ok)
                if kind == "startup" and changed is True:
                    c.started = True
                    if "readiness" in c.workers:
                        c.workers["readiness"].trigger = True
                elif kind in ("startup", "liveness") and changed is False:
                    self.event(p, "Normal", "Killing", f"Container {ctr.get('name')} failed "
                               f"{kind} probe, will be restarted", "kubelet")
                    c.signal(signal.SIGKILL)  # failed: the kubelet kills and restarts it
                    c.killed = True
                    if c.proc is not None:
                        c.proc.wait()
                    self.container_died(p, c, now)
                    return
            if w.due(now) and w.begin(c, now):
                w.pending = self.probes.submit(probe, c.ip, c.port, w.spec, named)

    def write_pod_status(self, p, c):
        old = p.get("status") or {}
        s = copy.deepcopy(old)
        ready = c.ready()
        ctrs = p["spec"].get("containers") or []
        statuses = []
        for i, ctr in enumerate(ctrs):
            image = ctr.get("image", "")
            cs = {"name": ctr.get("name"), "image": image, "imageID": f"sim://{image}",
                  "containerID": f"sim://{c.uid[:8]}-{i}-{c.restarts}",
                  "ready": ready if i == 0 else True,
                  "started": c.started if i == 0 else True,
                  "restartCount": c.restarts if i == 0 else 0,
                  "state": {"running": {"startedAt": c.started_at}}, "lastState": {}}
            if i == 0 and c.waiting:
                cs["state"] = {"waiting": {"reason": c.waiting[0], "message": c.waiting[1]}}
                cs["started"] = False
            if i == 0 and c.last_exit:
                cs["lastState"] = {"terminated": c.last_exit}
            statuses.append(cs)
        s["phase"] = "Running" if c.ran else "Pending"  # Running once a container ran
        s.update({"podIP": c.ip, "podIPs": [{"ip": c.ip}], "hostIP": "127.0.0.1",
                  "hostIPs": [{"ip": "127.0.0.1"}]})
        s.setdefault("startTime", now_iso())
        s["containerStatuses"] = statuses
        s.setdefault("qosClass", qos_class(p["spec"]))
        conds = copy.deepcopy(s.get("conditions") or [])
        unready = [cs["name"] for cs in statuses if not cs["ready"]]
        set_condition(conds, "PodReadyToStartContainers", "True")
        set_condition(conds, "Initialized", "True")
        for ctype in ("Ready", "ContainersReady"):
            if unready:
                set_condition(conds, ctype, "False", "ContainersNotReady",
                              f"containers with unready status: [{' '.join(unready)}]")
            else:
                set_condition(conds, ctype, "True")
        set_condition(conds, "PodScheduled", "True")
        order = ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                 "PodScheduled"]
        conds.sort(key=lambda x: order.index(x["type"]) if x["type"] in order else 99)
        for x in conds:
            x.setdefault("lastProbeTime", None)
        s["conditions"] = conds
        if s != old:
            self.store.mutate("pods", meta(p)["namespace"], meta(p)["name"],
                              lambda o: o.__setitem__("status", s))

    def kill_pod(self, p, c, now):
        """A deleted pod: SIGTERM, SIGKILL after the grace period, then gone."""
        md = meta(p)
        if c is None:
            self.store.delete("pods", md["namespace"], md["name"], md["uid"])
            return
        if c.term_at is None:
            grace = md.get("deletionGracePeriodSeconds",
                           p["spec"].get("terminationGracePeriodSeconds", 30))
            c.term_at, c.kill_at = now, now + grace
            c.signal(signal.SIGTERM)
            self.event(p, "Normal", "Killing", "Stopping container "
                       f"{(p['spec'].get('containers') or [{}])[0].get('name')}", "kubelet")
        if not c.alive():
            self.containers.pop(md["uid"], None)
            self.store.delete("pods", md["namespace"], md["name"], md["uid"])
        elif now >= c.kill_at and not c.killed:
            c.killed = True
            c.signal(signal.SIGKILL)

    def alloc_ip(self):
        used = {(p.get("status") or {}).get("podIP") for p in self.store.all("pods")}
        used |= {c.ip for c in self.containers.values()}
        while True:
            i = self.ip_next
            self.ip_next += 1
            ip = f"127.{self.args.pod_subnet}.{i // 250 % 256}.{i % 250 + 2}"
            if ip not in used:
                return ip

    @staticmethod
    def server_port(p):
        for ctr in p["spec"].get("containers") or []:
            for port in ctr.get("ports") or []:
                return port["containerPort"]
        return 8000

    def server_command(self, p, ip, port):
        """The model server this pod's container runs, from its annotations."""
        anns = meta(p).get("annotations") or {}
        kind = anns.get("sim.thaw.dev/server", "c")
        loading = anns.get("sim.thaw.dev/loading", "bind-late")
        load_ms = anns.get("sim.thaw.dev/load-ms", str(self.args.load_ms))
        token_ms = anns.get("sim.thaw.dev/token-ms", "5")
        model = (meta(p).get("labels") or {}).get("thaw.dev/model", "sim")
        if loading not in ("bind-late", "503"):
            raise ValueError(f'sim.thaw.dev/loading: "{loading}" is not bind-late or 503')
        for k, v in (("load-ms", load_ms), ("token-ms", token_ms)):
            if not v.isdigit():
                raise ValueError(f'sim.thaw.dev/{k}: "{v}" is not a number of milliseconds')
        if kind == "c":
            cmd = [self.args.model_sim, "--host", ip, "--port", str(port), "--load-ms", load_ms,
                   "--load-mode", "listen-late" if loading == "bind-late" else "503",
                   "--token-ms", token_ms, "--tokens", "4", "--model", model]
            if anns.get("sim.thaw.dev/ready-file"):
                cmd += ["--ready-file", anns["sim.thaw.dev/ready-file"]]
            fault = anns.get("sim.thaw.dev/sleep-fault")
            if fault:
                if fault not in ("fail-sleep", "fail-wake"):
                    raise ValueError(f'sim.thaw.dev/sleep-fault: "{fault}" is not fail-sleep '
                                     'or fail-wake')
                cmd += ["--" + fault]
            if anns.get("sim.thaw.dev/error-pct", "").isdigit():
                cmd += ["--error-pct", anns["sim.thaw.dev/error-pct"]]
            for k in ("sleep-ms", "wake-ms"):
                if anns.get(f"sim.thaw.dev/{k}", "").isdigit():
                    cmd += [f"--{k}", anns[f"sim.thaw.dev/{k}"]]
            return cmd
        if kind == "asyncio":
            cmd = [sys.executable, os.path.join(HERE, "pod_netns.py"), ip,
                   self.args.asyncio_server, "--port", str(port),
                   "--load-seconds", str(int(load_ms) / 1000), "--loading-mode", loading,
                   "--token-delay-ms", token_ms, "--tokens", "4", "--model", model]
            if anns.get("sim.thaw.dev/sleep-mode") == "true":
                cmd += ["--enable-sleep-mode"]
            return cmd
        if kind == "asyncio-model":
            cmd = [sys.executable, self.args.asyncio_model, "--host", ip, "--port", str(port),
                   "--load-ms", load_ms, "--loading-mode", loading, "--token-ms", token_ms,
                   "--tokens", "4"]
            if anns.get("sim.thaw.dev/ready-file"):
                cmd += ["--ready-file", anns["sim.thaw.dev/ready-file"]]
            return cmd
        raise ValueError(f'sim.thaw.dev/server: "{kind}" is not c, asyncio or asyncio-model')

    # -- endpointslice controller --
    def sync_endpointslices(self, svcs, pods, slices, nodes=None):
        zones = {meta(n)["name"]: (meta(n).get("labels") or {}).get("topology.kubernetes.io/zone")
                 for n in (nodes or self.store.all("nodes"))}
        for svc in svcs:
            self.sync_service_slices(svc, pods, slices, zones)

    def sync_service_slices(self, svc, pods, slices, zones):
        md, spec = meta(svc), svc.get("spec") or {}
        ns, name = md["namespace"], md["name"]
        mine = [s for s in slices if meta(s)["namespace"] == ns and
                (meta(s).get("labels") or {}).get("kubernetes.io/service-name") == name and
                (meta(s).get("labels") or {}).get("endpointslice.kubernetes.io/managed-by")
                == MANAGED_BY]
        sel = spec.get("selector")
        if not sel or spec.get("type") == "ExternalName":
            for s in mine:
                self.delete_object("endpointslices", s)
            return
        groups = {}  # the pods' resolved ports -> endpoints
        for p in sorted(pods, key=lambda p: meta(p)["name"]):
            if meta(p)["namespace"] != ns or not p.get("status", {}).get("podIP") or \
                    p["status"].get("phase") in ("Failed", "Succeeded"):
                continue
            labels = meta(p).get("labels") or {}
            if any(labels.get(k) != v for k, v in sel.items()):
                continue
            ports = self.resolve_ports(spec, p)
            serving = pod_ready(p)
            term = terminating(p)
            ep = {"addresses": [p["status"]["podIP"]],
                  "conditions": {"ready": bool(spec.get("publishNotReadyAddresses")) or
                                 (serving and not term),
                                 "serving": serving, "terminating": term},
                  "targetRef": {"kind": "Pod", "namespace": ns, "name": meta(p)["name"],
                                "uid": meta(p)["uid"]},
                  "nodeName": p["spec"].get("nodeName")}
            zone = zones.get(p["spec"].get("nodeName"))
            if zone:
                ep["zone"] = zone
            groups.setdefault(json.dumps(ports), (ports, []))[1].append(ep)
        want = []
        for ports, eps in groups.values():
            for i in range(0, len(eps), MAX_ENDPOINTS_PER_SLICE):
                want.append((ports, eps[i:i + MAX_ENDPOINTS_PER_SLICE]))
        if not want:
            want = [([], [])]  # the placeholder slice a Service without endpoints has
        labels = dict(md.get("labels") or {})
        labels.update({"kubernetes.io/service-name": name,
                       "endpointslice.kubernetes.io/managed-by": MANAGED_BY})
        spare = sorted(mine, key=created)
        for ports, eps in want:
            cur = next((s for s in spare if s.get("ports") == ports), spare[0] if spare else None)
            if cur is None:
                self.store.create("endpointslices", {
                    "metadata": {"generateName": name + "-", "namespace": ns, "labels": labels,
                                 "ownerReferences": [owner_ref(svc)]},
                    "addressType": "IPv4", "endpoints": eps, "ports": ports},
                    "EndpointSlice", "discovery.k8s.io/v1")
                continue
            spare.remove(cur)
            if cur.get("endpoints") != eps or cur.get("ports") != ports or \
                    meta(cur).get("labels") != labels:
                def fn(o, eps=eps, ports=ports):
                    o["endpoints"], o["ports"] = eps, ports
                    o["metadata"]["labels"] = labels
                self.store.mutate("endpointslices", ns, meta(cur)["name"], fn)
        for s in spare:
            self.delete_object("endpointslices", s)

    @staticmethod
    def resolve_ports(spec, p):
        named = {}
        for ctr in p["spec"].get("containers") or []:
            for port in ctr.get("ports") or []:
                if port.get("name"):
                    named[port["name"]] = port.get("containerPort")
        out = []
        for sp in spec.get("ports") or []:
            target = sp.get("targetPort", sp.get("port"))
            if isinstance(target, str) and not target.isdigit():
                target = named.get(target)
                if target is None:
                    continue
            out.append({"name": sp.get("name", ""), "port": int(target),
                        "protocol": sp.get("protocol", "TCP")})
        return out

    # -- restart adoption --
    def kubelet_state(self):
        """What a node keeps across the API server's restart: its running
        containers."""
        return {uid: {"pid": c.pid, "ip": c.ip, "port": c.port, "restarts": c.restarts,
                      "started": c.started, "started_at": c.started_at,
                      "ready": c.ready()}
                for uid, c in self.containers.items() if c.alive()}

    def adopt(self, saved):
        now = time.monotonic()
        period = self.period_override()
        for p in self.store.all("pods"):
            rec = saved.get(meta(p)["uid"])
            if not rec:
                continue
            c = Container(p, rec["ip"], rec["port"])
            c.pid, c.restarts, c.started = rec["pid"], rec["restarts"], rec["started"]
            c.ran = True
            c.started_at = rec.get("started_at", c.started_at)
            c.started_mono = now - 3600  # long past any initialDelaySeconds
            ctr = (p["spec"].get("containers") or [{}])[0]
            for kind in ("startup", "readiness", "liveness"):
                pspec = ctr.get(kind + "Probe")
                if isinstance(pspec, dict):
                    result = {"readiness": rec["ready"], "liveness": True,
                              "startup": rec["started"]}[kind]
                    w = ProbeWorker(kind, pspec, period, now, result)
                    w.next_tick = now + w.period
                    c.workers[kind] = w
            self.containers[meta(p)["uid"]] = c

    def shutdown(self, keep_pods=False):
        self.stop = True
        if keep_pods:
            return  # the "nodes" keep running their pods while the API restarts
        for c in self.containers.values():
            c.signal(signal.SIGTERM)
        for c in self.containers.values():
            if c.proc is not None:
                try:
                    c.proc.wait(5)
                except subprocess.TimeoutExpired:
                    c.proc.kill()
            else:
                for _ in range(50):
                    if not c.alive():
                        break
                    time.sleep(0.1)
                c.signal(signal.SIGKILL)


def begin_pod_deletion(store, ns, name, grace=None, uid=None):
    """A graceful pod delete: deletionTimestamp and the grace period are set
    and the kubelet takes it from there; a pod on no node goes at once, and
    so does one deleted with a grace period of 0."""
    p = store.get("pods", ns, name)
    if uid and meta(p)["uid"] != uid:
        raise ApiError(409, "Conflict", f'Precondition failed: UID in precondition: {uid}, '
                       f'UID in object meta: {meta(p)["uid"]}')
    if grace is None:
        grace = p["spec"].get("terminationGracePeriodSeconds", 30)
    if not p["spec"].get("nodeName") or grace == 0:
        return store.delete("pods", ns, name)
    if terminating(p) and meta(p).get("deletionGracePeriodSeconds", grace) <= grace:
        return p

    def fn(o):
        o["metadata"]["deletionTimestamp"] = now_iso(grace)
        o["metadata"]["deletionGracePeriodSeconds"] = grace
    with store.lock:
        cur = store._table("pods").get((ns, name))
        if cur is None:
            raise ApiError(404, "NotFound", f'pods "{name}" not found')
        new = copy.deepcopy(cur)
        fn(new)
        # deletionTimestamp is kept by updates, so write it in directly.
        new["metadata"]["resourceVersion"] = store._bump()
        store._table("pods")[(ns, name)] = new
        store._record("pods", "MODIFIED", new)
        return copy.deepcopy(new)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kube-sim/1"

    def log_message(self, fmt, *args):
        if self.server.sim_args.verbose:
            sys.stderr.write("kube-sim: " + (fmt % args) + "\n")

    # -- plumbing --
    def send_json(self, code, obj, extra_headers=None):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (extra_headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def raw_body(self):
        """The request's body, read once (a fault may look at it first)."""
        if self._raw is None:
            n = int(self.headers.get("Content-Length") or 0)
            self._raw = self.rfile.read(n) if n else b""
        return self._raw

    def body(self):
        raw = self.raw_body()
        if not raw:
            return None
        if "protobuf" in self.headers.get("Content-Type", ""):
            raise ApiError(415, "UnsupportedMediaType", "this API server speaks JSON only "
                           "(application/vnd.kubernetes.protobuf is not supported)")
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(400, "BadRequest", "request body is not JSON")

    def authorized(self):
        tokens = self.server.sim.tokens
        if not tokens:
            return True
        auth = self.headers.get("Authorization", "")
        return auth.startswith("Bearer ") and auth[7:] in tokens

    def handle_any(self, method):
        sim = self.server.sim
        self._raw = None
        url = urllib.parse.urlsplit(self.path)
        q = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        path = url.path.rstrip("/") or "/"
        try:
            if path.startswith("/_sim/"):
                return self.control(method, path)
            sim.counters["requests"] += 1
            if not self.authorized():
                sim.counters["unauthorized"] += 1
                raise ApiError(401, "Unauthorized", "Unauthorized")
            if sim.delay_ms and (not sim.delay_methods or method in sim.delay_methods):
                time.sleep(sim.delay_ms / 1000)
            if sim.refuse_watches and method == "GET" and \
                    (q.get("watch") or "").lower() in ("true", "1"):
                # As for a Role that grants list but not watch.
                sim.counters["refused_watches"] += 1
                raise ApiError(403, "Forbidden", "cannot watch this resource (refused by fault)")
            if sim.fail_next > 0 and (not sim.fail_matching or
                                      sim.fail_matching.encode() in self.raw_body()):
                sim.fail_next -= 1
                sim.counters["injected_500"] += 1
                raise ApiError(500, "InternalError", "injected failure")
            if method == "GET" and self.discovery(path):
                return
            self.resource(method, path, q)
        except ApiError as e:
            self.send_json(e.code, status_obj(e.code, e.reason, e.message, e.details))
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):
        self.handle_any("GET")

    def do_POST(self):
        self.handle_any("POST")

    def do_PUT(self):
        self.handle_any("PUT")

    def do_PATCH(self):
        self.handle_any("PATCH")

    def do_DELETE(self):
        self.handle_any("DELETE")

    # -- control --
    def control(self, method, path):
        sim = self.server.sim
        if path == "/_sim/state":
            return self.send_json(200, dict(sim.cluster_view(), counters=sim.counters,
                                            rv=sim.store.rv,
                                            watches=sim.counters["watches_open"],
                                            scale_log=sim.scale_log[-1000:]))
        if path == "/_sim/faults" and method == "POST":
            f = self.body() or {}
            if f.get("drop_watches"):
                sim.store.drop_watches()
            if "fail_next" in f:
                sim.fail_next = int(f["fail_next"])
                sim.fail_matching = f.get("fail_matching") or ""
            if "delay_ms" in f:
                sim.delay_ms = int(f["delay_ms"])
                sim.delay_methods = set(f.get("delay_methods") or ())
            if f.get("compact"):
                sim.store.compact()
            if "expire_pages" in f:
                sim.store.expire_pages = bool(f["expire_pages"])
            if "refuse_watches" in f:
                sim.refuse_watches = bool(f["refuse_watches"])
            if "tokens" in f:
                sim.tokens = set(f["tokens"])
            return self.send_json(200, {"ok": True})
        raise ApiError(404, "NotFound", "no such control")

    # -- discovery --
    def discovery(self, path):
        if path == "/version":
            self.send_json(200, {"major": "1", "minor": "32", "gitVersion": "v1.32.0-kube-sim",
                                 "platform": "linux/amd64"})
            return True
        if path == "/api":
            self.send_json(200, {"kind": "APIVersions", "versions": ["v1"],
                                 "serverAddressByClientCIDRs": [
                                     {"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]})
            return True
        if path == "/apis":
            groups = sorted({g for g, _, _ in RESOURCES if g})
            self.send_json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}],
                 "preferredVersion": {"groupVersion": f"{g}/v1", "version": "v1"}}
                for g in groups]})
            return True
        parts = path.strip("/").split("/")
        gv = None
        if parts == ["api", "v1"]:
            gv = ("", "v1")
        elif len(parts) == 3 and parts[0] == "apis":
            gv = (parts[1], parts[2])
        if gv is None:
            return False
        res = []
        for (g, v, plural), (kind, namespaced) in RESOURCES.items():
            if (g, v) != gv:
                continue
            verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
            res.append({"name": plural, "singularName": kind.lower(), "namespaced": namespaced,
                        "kind": kind, "verbs": verbs, "shortNames": SHORT.get(plural, [])})
            if plural in SCALABLE:
                res.append({"name": f"{plural}/scale", "singularName": "", "namespaced": True,
                            "group": "autoscaling", "version": "v1", "kind": "Scale",
                            "verbs": ["get", "patch", "update"]})
            if plural in STATUS_SUBRESOURCE:
                res.append({"name": f"{plural}/status", "singularName": "",
                            "namespaced": namespaced, "kind": kind,
                            "verbs": ["get", "patch", "update"]})
        if not res:
            return False
        self.send_json(200, {"kind": "APIResourceList", "apiVersion": "v1",
                             "groupVersion": api_version(*gv), "resources": res})
        return True

    # -- resources --

    # -- resources --
    def resource(self, method, path, q):
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 2:
            group, version, rest = "", parts[1], parts[2:]
        elif parts[0] == "apis" and len(parts) >= 3:
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        ns = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            ns, rest = rest[1], rest[2:]
        if not rest:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        key = (group, version, plural)
        if key not in RESOURCES:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        kind, namespaced = RESOURCES[key]
        apiv = api_version(group, version)
        store = self.server.sim.store
        if namespaced and name and ns is None:
            raise ApiError(404, "NotFound", "namespace required")
        if not namespaced:
            ns = ""
        if name is None:
            if method == "GET":
                if (q.get("watch") or "").lower() in ("true", "1"):
                    return self.watch(plural, ns, q, kind, apiv)
                return self.send_json(200, list_page(
                    store, plural, ns, kind, apiv, parse_label_selector(q.get("labelSelector")),
                    parse_field_selector(q.get("fieldSelector")), q))
            if method == "POST":
                obj = self.body() or {}
                if not isinstance(obj, dict):
                    raise ApiError(400, "BadRequest", "the body must be a JSON object")
                obj.setdefault("metadata", {})
                if namespaced:
                    body_ns = obj["metadata"].get("namespace")
                    if body_ns and body_ns != ns:
                        raise ApiError(400, "BadRequest", "the namespace of the provided object "
                                       "does not match the namespace sent on the request")
                    obj["metadata"]["namespace"] = ns
                if plural in STATUS_SUBRESOURCE and plural != "nodes":
                    obj.pop("status", None)  # a new object's status is the server's
                self.admit(plural, kind, obj, None)
                if namespaced:
                    self.server.sim.ensure_namespace(ns)
                made = store.create(plural, obj, kind, apiv)
                if plural == "namespaces":
                    made = store.mutate("namespaces", "", made["metadata"]["name"],
                                        namespace_defaults)
                return self.send_json(201, made)
            raise ApiError(405, "MethodNotAllowed", "method not allowed")
        if sub == "scale" and plural in SCALABLE:
            return self.scale(method, plural, ns, name)
        if sub == "status" and plural in STATUS_SUBRESOURCE:
            return self.write(method, plural, kind, ns, name, status_only=True)
        if sub:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if method == "GET":
            return self.send_json(200, store.get(plural, ns, name))
        if method in ("PUT", "PATCH"):
            return self.write(method, plural, kind, ns, name)
        if method == "DELETE":
            return self.delete(plural, kind, ns, name, q)
        raise ApiError(405, "MethodNotAllowed", "method not allowed")

    def admit(self, plural, kind, obj, cur):
        """Defaulting and validation, as the API server's registry does them."""
        causes = []
        name = obj.get("metadata", {}).get("name") or obj.get("metadata", {}).get(
            "generateName", "")
        if plural in ("deployments", "replicasets"):
            default_workload(obj, causes, kind)
            if cur is not None and obj["spec"].get("selector") != cur["spec"].get("selector"):
                causes.append(f"spec.selector: Invalid value: {json.dumps(obj['spec'].get('selector'))}: "
                              "field is immutable")
        elif plural == "pods":
            default_pod_spec(obj.setdefault("spec", {}), causes)
            obj.setdefault("status", {}).setdefault("phase", "Pending")
            obj["status"].setdefault("qosClass", qos_class(obj["spec"]))
            if cur is not None and cur["spec"].get("nodeName") and \
                    obj["spec"].get("nodeName") != cur["spec"]["nodeName"]:
                causes.append("spec: Forbidden: pod updates may not change fields other than "
                              "`spec.containers[*].image`, `spec.activeDeadlineSeconds`, "
                              "`spec.tolerations` (only additions to existing tolerations)")
        elif plural == "services":
            if cur is not None:
                spec = obj.setdefault("spec", {})
                for k in ("clusterIP", "clusterIPs"):
                    if k in cur.get("spec", {}):
                        spec.setdefault(k, cur["spec"][k])
                if spec.get("clusterIP") != cur.get("spec", {}).get("clusterIP"):
                    causes.append("spec.clusterIP: Invalid value: field is immutable")
            default_service(obj, causes, self.server.sim.alloc_cluster_ip)
        elif plural == "nodes":
            default_node(obj)
        elif plural in ("secrets", "configmaps"):
            validate_data(plural, obj, causes)
        if causes:
            group = {"deployments": ".apps", "replicasets": ".apps"}.get(plural, "")
            raise invalid(kind + group, name, causes)

    def write(self, method, plural, kind, ns, name, status_only=False):
        """PUT and PATCH: on the object (its status kept as it is, for kinds
        with a status subresource) or on its /status (only the status)."""
        store = self.server.sim.store
        body = self.body()
        cur = store.get(plural, ns, name)
        if method == "PUT":
            new = body or {}
            if not isinstance(new, dict):
                raise ApiError(400, "BadRequest", "the body must be a JSON object")
            if new.get("metadata", {}).get("name", name) != name:
                raise ApiError(400, "BadRequest", "the name of the object does not match the "
                               "name on the URL")
        elif method == "PATCH":
            new = apply_patch(self.headers.get("Content-Type", ""), cur,
                              body if body is not None else {})
            if not isinstance(new, dict):
                raise ApiError(422, "Invalid", "the patch does not leave an object")
            want_rv = ((body or {}).get("metadata") or {}).get("resourceVersion") \
                if isinstance(body, dict) else None
            new.setdefault("metadata", {})["resourceVersion"] = want_rv or \
                cur["metadata"]["resourceVersion"]
        else:
            raise ApiError(405, "MethodNotAllowed", "method not allowed")
        new.setdefault("metadata", {})
        if "namespace" in cur["metadata"]:
            new["metadata"]["namespace"] = cur["metadata"]["namespace"]
        if status_only:
            rv = new["metadata"].get("resourceVersion")
            status = new.get("status")
            new = copy.deepcopy(cur)
            new["metadata"]["resourceVersion"] = rv
            if status is None:
                new.pop("status", None)
            else:
                new["status"] = status
        else:
            if plural in STATUS_SUBRESOURCE:
                if "status" in cur:
                    new["status"] = cur["status"]
                else:
                    new.pop("status", None)
            self.admit(plural, kind, new, cur)
        return self.send_json(200, store.update(plural, ns, name, new))

    def delete(self, plural, kind, ns, name, q):
        sim = self.server.sim
        store = sim.store
        opts = {}
        try:
            opts = self.body() or {}
        except ApiError:
            pass
        grace = q.get("gracePeriodSeconds", opts.get("gracePeriodSeconds"))
        policy = q.get("propagationPolicy") or opts.get("propagationPolicy") or "Background"
        uid = (opts.get("preconditions") or {}).get("uid")
        if plural == "pods":
            return self.send_json(200, begin_pod_deletion(
                store, ns, name, None if grace is None else int(grace), uid))
        cur = store.get(plural, ns, name)
        if uid and cur["metadata"]["uid"] != uid:
            raise ApiError(409, "Conflict", "Precondition failed: UID in precondition: "
                           f"{uid}, UID in object meta: {cur['metadata']['uid']}")
        if policy == "Orphan":
            sim.orphan_dependents(cur["metadata"]["uid"])
        store.delete(plural, ns, name)
        return self.send_json(200, {"kind": "Status", "apiVersion": "v1", "metadata": {},
                                    "status": "Success",
                                    "details": {"name": name, "kind": plural,
                                                "uid": cur["metadata"]["uid"]}})

    def scale(self, method, plural, ns, name):
        store = self.server.sim.store
        self.server.sim.counters[f"scale_{method.lower()}"] += 1
        obj = store.get(plural, ns, name)

        def as_scale(o):
            spec = {}
            if o.get("spec", {}).get("replicas"):
                spec["replicas"] = o["spec"]["replicas"]  # omitempty, as the real one
            status = {"replicas": o.get("status", {}).get("replicas", 0),
                      "selector": selector_string(o.get("spec", {}).get("selector"))}
            return {"kind": "Scale", "apiVersion": "autoscaling/v1",
                    "metadata": {"name": name, "namespace": ns,
                                 "uid": o["metadata"]["uid"],
                                 "resourceVersion": o["metadata"]["resourceVersion"],
                                 "creationTimestamp": o["metadata"]["creationTimestamp"]},
                    "spec": spec, "status": status}
        if method == "GET":
            return self.send_json(200, as_scale(obj))
        body = self.body() or {}
        if method == "PATCH":
            scale = apply_patch(self.headers.get("Content-Type", ""), as_scale(obj), body)
            want_rv = (body.get("metadata") or {}).get("resourceVersion") \
                if isinstance(body, dict) else None
        elif method == "PUT":
            scale = body
            want_rv = (body.get("metadata") or {}).get("resourceVersion")
        else:
            raise ApiError(405, "MethodNotAllowed", "method not allowed")
        n = (scale.get("spec") or {}).get("replicas") or 0
        if not isinstance(n, int) or n < 0:
            raise invalid("Scale.autoscaling", name,
                          [f"spec.replicas: Invalid value: {n!r}: must be greater than or "
                           "equal to 0"])
        obj["spec"]["replicas"] = n
        obj["metadata"]["resourceVersion"] = want_rv or obj["metadata"]["resourceVersion"]
        new = store.update(plural, ns, name, obj)
        self.server.sim.counters["scale_writes"] += 1
        self.server.sim.scale_log.append((name, n))
        return self.send_json(200, as_scale(new))

    def watch(self, plural, ns, q, kind, apiv):
        sim = self.server.sim
        store = sim.store
        lsel = parse_label_selector(q.get("labelSelector"))
        fsel = parse_field_selector(q.get("fieldSelector"))
        bookmarks = (q.get("allowWatchBookmarks") or "").lower() in ("true", "1")
        timeout = float(q.get("timeoutSeconds") or 1800)
        start_rv = q.get("resourceVersion")
        filtered = bool(q.get("labelSelector") or q.get("fieldSelector"))
        selected = {}  # (namespace, name) -> chosen by the selectors

        def sel(o):
            return lsel(o["metadata"].get("labels")) and fsel(o)

        def obj_key(o):
            return (o["metadata"].get("namespace", ""), o["metadata"]["name"])
        try:
            asked_rv = int(start_rv) if start_rv not in (None, "", "0") else 0
        except ValueError:
            asked_rv = 0
        if asked_rv > store.rv:
            # A version this server has not reached (it was restored from an
            # older etcd, or restarted empty): the watch cache waits up to 3 s
            # for it, then answers 504 with ResourceVersionTooLarge, before any
            # event is streamed. Clients list again.
            with store.lock:
                give_up = time.monotonic() + 3
                while store.rv < asked_rv and time.monotonic() < give_up:
                    store.lock.wait(0.2)
            if store.rv < asked_rv:
                raise ApiError(504, "Timeout",
                               f"Too large resource version: {asked_rv}, current: {store.rv}",
                               {"causes": [{"reason": "ResourceVersionTooLarge",
                                            "message": "Too large resource version"}],
                                "retryAfterSeconds": 1})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(event):
            data = (json.dumps(event) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        deadline = time.monotonic() + timeout
        next_bookmark = time.monotonic() + sim.args.bookmark_s
        sim.counters["watches"] += 1
        sim.counters["watches_open"] += 1
        try:
            with store.lock:
                gen = store.watch_generation
                if start_rv in (None, "", "0"):
                    # Synthetic ADDED for what exists, then changes.
                    items = [copy.deepcopy(o) for (n, _), o in sorted(store._table(plural).items())
                             if (ns is None or n == ns)
                             and lsel(o["metadata"].get("labels")) and fsel(o)]
                    pos_rv = store.rv
                    pending = [("ADDED", o) for o in items]
                    selected = {obj_key(o): True for o in items}
                else:
                    try:
                        pos_rv = int(start_rv)
                    except ValueError:
                        pos_rv = -1
                    pending = []
                    if pos_rv < store.compacted_rv:
                        pending = None
                    elif filtered:
                        # Which objects the selectors chose as of pos_rv, so that
                        # one that leaves them later is seen to go.
                        for rv, p, t, o in store.history[:bisect.bisect_right(
                                store.history, pos_rv, key=lambda e: e[0])]:
                            if p == plural:
                                selected[obj_key(o)] = t != "DELETED" and sel(o)
            if pending is None:
                send({"type": "ERROR", "object": status_obj(
                    410, "Expired", f"too old resource version: {pos_rv} ({store.compacted_rv})")})
                return self.end_chunks()
            for etype, o in pending:
                send({"type": etype, "object": o})
            while time.monotonic() < deadline:
                with store.lock:
                    if store.watch_generation != gen:
                        break
                    def collect():
                        start = bisect.bisect_right(store.history, pos_rv, key=lambda e: e[0])
                        return [(rv, t, o) for rv, p, t, o in store.history[start:]
                                if p == plural and
                                (ns is None or o["metadata"].get("namespace", "") == ns)]
                    if pos_rv < store.compacted_rv:
                        events = None
                    else:
                        events = collect()
                        if not events:
                            store.lock.wait(0.2)
                            events = None if pos_rv < store.compacted_rv else collect()
                        if events is not None and store.history:
                            pos_rv = max(pos_rv, store.history[-1][0])
                if events is None:
                    send({"type": "ERROR", "object": status_obj(410, "Expired",
                                                                "too old resource version")})
                    break
                for rv, t, o in events:
                    if not filtered:
                        send({"type": t, "object": o})
                        continue
                    # With selectors, as the real server: an object that comes
                    # to match is ADDED, one that stops matching is DELETED.
                    key, now_in = obj_key(o), sel(o)
                    was_in = selected.get(key)
                    if t == "DELETED":
                        if now_in or was_in:
                            send({"type": "DELETED", "object": o})
                        selected[key] = False
                    elif now_in:
                        send({"type": "ADDED" if t == "ADDED" or was_in is False else t,
                              "object": o})
                        selected[key] = True
                    else:
                        if was_in:
                            send({"type": "DELETED", "object": o})
                        selected[key] = False
                if bookmarks and time.monotonic() >= next_bookmark:
                    send({"type": "BOOKMARK", "object": {
                        "kind": kind, "apiVersion": apiv,
                        "metadata": {"resourceVersion": str(pos_rv)}}})
                    next_bookmark = time.monotonic() + sim.args.bookmark_s
            self.end_chunks()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self.close_connection = True
        finally:
            sim.counters["watches_open"] -= 1

    def end_chunks(self):
        try:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass
        self.close_connection = True




class Counters(dict):
    def __missing__(self, key):
        return 0


class Sim:
    def __init__(self, args):
        self.args = args
        self.store = Store(history=args.history)
        self.tokens = set(args.token or [])
        self.fail_next = 0
        self.fail_matching = ""
        self.refuse_watches = False
        self.delay_ms = 0
        self.delay_methods = set()
        self.counters = Counters()
        self.scale_log = []
        self.cluster_ip_next = 1
        saved = {}
        if args.state and os.path.exists(args.state):
            with open(args.state) as f:
                saved = self.store.load(json.load(f))
            used = [o["spec"].get("clusterIP", "") for o in self.store.all("services")]
            self.cluster_ip_next += len(used)
        else:
            try:
                nodes = json.loads(args.nodes)
            except ValueError as e:
                raise SystemExit(f"kube-sim: --nodes is not JSON: {e}")
            for n in nodes:
                node = make_node(n)
                default_node(node)
                self.store.create("nodes", node, "Node", "v1")
            for ns in ("default", "kube-system", "kube-public", "kube-node-lease"):
                self.ensure_namespace(ns)
        self.cluster = Cluster(self.store, args)
        self.cluster.adopt(saved)

    def ensure_namespace(self, ns):
        """Namespaces appear when first used (the NamespaceAutoProvision
        admission plugin), so that clients that read them find them."""
        try:
            self.store.get("namespaces", "", ns)
        except ApiError:
            try:
                self.store.create("namespaces", namespace_defaults({"metadata": {"name": ns}}),
                                  "Namespace", "v1")
            except ApiError:
                pass  # created meanwhile

    def alloc_cluster_ip(self):
        i = self.cluster_ip_next
        self.cluster_ip_next += 1
        return f"10.96.{i // 254 % 256}.{i % 254 + 1}"

    def orphan_dependents(self, uid):
        """propagationPolicy=Orphan: dependents lose their owner, and stay."""
        for plural in ("replicasets", "pods", "endpointslices"):
            for o in self.store.all(plural):
                refs = o["metadata"].get("ownerReferences") or []
                if any(r.get("uid") == uid for r in refs):
                    def fn(x):
                        left = [r for r in x["metadata"].get("ownerReferences") or []
                                if r.get("uid") != uid]
                        if left:
                            x["metadata"]["ownerReferences"] = left
                        else:
                            x["metadata"].pop("ownerReferences", None)
                    self.store.mutate(plural, o["metadata"].get("namespace", ""),
                                      o["metadata"]["name"], fn)

    def cluster_view(self):
        """For tests: nodes with their pods and requested resources,
        ReplicaSets, pods."""
        pods = self.store.all("pods")
        nodes = {}
        for n in self.store.all("nodes"):
            name = n["metadata"]["name"]
            mine = [p for p in pods if p["spec"].get("nodeName") == name and
                    p.get("status", {}).get("phase") not in ("Succeeded", "Failed")]
            req = {}
            for p in mine:
                for r, q in pod_requests(p["spec"]).items():
                    req[r] = req.get(r, 0) + q
            nodes[name] = {"pods": [f"{p['metadata']['namespace']}/{p['metadata']['name']}"
                                    for p in mine],
                           "requested": {r: fmt_quantity(q) for r, q in sorted(req.items())},
                           "allocatable": n.get("status", {}).get("allocatable", {}),
                           "unschedulable": bool(n.get("spec", {}).get("unschedulable")),
                           "taints": n.get("spec", {}).get("taints", [])}
        rss = [{"namespace": rs["metadata"]["namespace"], "name": rs["metadata"]["name"],
                "owner": next((r["name"] for r in rs["metadata"].get("ownerReferences") or []
                               if r.get("controller")), None),
                "revision": revision(rs), "replicas": replicas(rs),
                "ready": st(rs, "readyReplicas"), "available": st(rs, "availableReplicas"),
                "pod_template_hash": rs["metadata"].get("labels", {}).get("pod-template-hash")}
               for rs in self.store.all("replicasets")]
        pod_view = []
        for p in pods:
            s = p.get("status") or {}
            c = self.cluster.containers.get(p["metadata"]["uid"])
            pod_view.append({
                "namespace": p["metadata"]["namespace"], "name": p["metadata"]["name"],
                "node": p["spec"].get("nodeName"), "phase": s.get("phase"),
                "ready": pod_ready(p), "ip": s.get("podIP"), "terminating": terminating(p),
                "owner": next((r["name"] for r in p["metadata"].get("ownerReferences") or []
                               if r.get("controller")), None),
                "server": (p["metadata"].get("annotations") or {}).get("sim.thaw.dev/server",
                                                                       "c"),
                "pid": c.pid if c else None,
                "restarts": c.restarts if c else 0})
        return {"nodes": nodes, "replicasets": rss, "pods": pod_view}


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file")
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--token", action="append", help="accepted bearer token (repeatable)")
    ap.add_argument("--nodes", default='[{"name": "gpu-node-1", "gpus": 1, "replicas": 4}]',
                    help="JSON list of nodes (see the module's docstring)")
    ap.add_argument("--model-sim", default=os.path.join(ROOT, "build", "thaw-model-sim"),
                    help="thaw-model-sim, the server of sim.thaw.dev/server: c")
    ap.add_argument("--asyncio-server", default=os.path.join(
        ROOT, "tests", "counterparts", "asyncio_server.py"),
        help="the server of sim.thaw.dev/server: asyncio")
    ap.add_argument("--asyncio-model", default=os.path.join(ROOT, "loadtest", "asyncio_model.py"),
                    help="the server of sim.thaw.dev/server: asyncio-model (the benchmarks' "
                         "asyncio server, which can write a ready file)")
    ap.add_argument("--load-ms", type=int, default=500,
                    help="model load time when a pod has no sim.thaw.dev/load-ms")
    ap.add_argument("--kubelet-period-ms", type=int, default=None,
                    help="every probe's period, overriding its periodSeconds (default: the "
                         "probe's own, 10 s when it sets none)")
    ap.add_argument("--tick-ms", type=int, default=50)
    ap.add_argument("--bookmark-s", type=float, default=5)
    ap.add_argument("--history", type=int, default=20000)
    ap.add_argument("--state")
    ap.add_argument("--pod-subnet", type=int, default=0,
                    help="pod IPs are 127.N.x.y (default: derived from the pid)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    if args.kubelet_period_ms is not None and args.kubelet_period_ms <= 0:
        ap.error("--kubelet-period-ms wants a number of milliseconds > 0")
    if not 1 <= args.pod_subnet <= 254:
        args.pod_subnet = 2 + os.getpid() % 250
    sim = Sim(args)
    srv = Server((args.host, args.port), Handler)
    srv.sim, srv.sim_args = sim, args
    if args.cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.cert, args.key)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    port = srv.server_address[1]
    sim.cluster.start()

    def stop(signum, _frame):
        # SIGTERM with --state: a restart; pods (their processes) keep running
        # and are adopted by the next run. SIGINT, or no --state: stop them.
        keep = bool(args.state) and signum == signal.SIGTERM
        sim.cluster.stop = True
        if args.state:
            with open(args.state + ".tmp", "w") as f:
                json.dump(sim.store.dump(sim.cluster.kubelet_state() if keep else {}), f)
            os.replace(args.state + ".tmp", args.state)
        sim.cluster.shutdown(keep_pods=keep)
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(str(port))
        os.replace(args.port_file + ".tmp", args.port_file)
    srv.serve_forever()


if __name__ == "__main__":
    main()
