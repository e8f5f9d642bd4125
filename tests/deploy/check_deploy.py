#!/usr/bin/python3
"""Static and live checks of deploy/ (issue 8).

usage: check_deploy.py SOURCE_DIR BINARY_DIR [SECTION...]
SECTIONS: parse k8s compose docker scripts prometheus grafana (default: all).
Exit 0 = pass, 1 = failures, 77 = skipped (ctest SKIP_RETURN_CODE), e.g. when
python3-yaml is missing for a section that needs it.
"""
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

try:
    import yaml  # Debian python3-yaml
except ImportError:  # pragma: no cover
    yaml = None

SRC = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.join(SRC, "build")
DEPLOY = os.path.join(SRC, "deploy")
ERRORS = []
SKIPPED = []


def fail(msg):
    ERRORS.append(msg)
    print("FAIL: " + msg)


def ok(msg):
    print("done: " + msg)


def rel(p):
    return os.path.relpath(p, SRC)


def need_yaml(section):
    if yaml is None:
        SKIPPED.append(section)
        print(f"SKIP {section}: python3 module 'yaml' missing (Debian package python3-yaml; "
              "add it to deploy/install-deps.sh)")
        return False
    return True


def walk(exts):
    for root, dirs, files in os.walk(DEPLOY):
        dirs[:] = [d for d in dirs if d not in ("demo",)]
        for f in sorted(files):
            if f.endswith(exts):
                yield os.path.join(root, f)


def load_yaml_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def server_flag_names():
    """Flag names infoflow-server accepts (server/server_options.cc Apply())."""
    with open(os.path.join(SRC, "server", "server_options.cc")) as f:
        text = f.read()
    names = set(re.findall(r'name == "([a-z0-9-]+)"', text))
    names.add("config")
    return names


# --------------------------------------------------------------------- parse
def check_parse():
    n = 0
    for p in walk((".json",)):
        try:
            with open(p) as f:
                json.load(f)
            n += 1
        except Exception as e:  # noqa: BLE001
            fail(f"{rel(p)}: invalid JSON: {e}")
    if need_yaml("parse(yaml)"):
        for p in walk((".yaml", ".yml")):
            try:
                load_yaml_docs(p)
                n += 1
            except Exception as e:  # noqa: BLE001
                fail(f"{rel(p)}: invalid YAML: {e}")
    ok(f"parse: {n} YAML/JSON files under deploy/")


# ----------------------------------------------------------------------- k8s
def labels_match(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_k8s():
    if not need_yaml("k8s"):
        return
    base = os.path.join(DEPLOY, "k8s", "base")
    kust = load_yaml_docs(os.path.join(base, "kustomization.yaml"))[0]
    objs = []
    for r in kust.get("resources", []):
        p = os.path.join(base, r)
        if not os.path.isfile(p):
            fail(f"k8s/base/kustomization.yaml: resource {r} does not exist")
            continue
        for d in load_yaml_docs(p):
            objs.append((r, d))
    for r, d in objs:
        for field in ("apiVersion", "kind"):
            if not d.get(field):
                fail(f"k8s/base/{r}: object without {field}")
        if not (d.get("metadata") or {}).get("name"):
            fail(f"k8s/base/{r}: {d.get('kind')} without metadata.name")
    by_kind = {}
    for r, d in objs:
        by_kind.setdefault(d.get("kind"), []).append(d)

    def one(kind):
        found = by_kind.get(kind, [])
        if not found:
            fail(f"k8s/base: no {kind}")
        return found

    flags = server_flag_names()
    configmaps = {c["metadata"]["name"]: c for c in by_kind.get("ConfigMap", [])}
    secrets = {s["metadata"]["name"]: s for s in by_kind.get("Secret", [])}
    services = {s["metadata"]["name"]: s for s in one("Service")}
    sts_list = one("StatefulSet")
    tmpl_labels = {}
    for sts in sts_list:
        name = sts["metadata"]["name"]
        spec = sts.get("spec", {})
        tmpl = spec.get("template", {})
        tmpl_labels = (tmpl.get("metadata") or {}).get("labels") or {}
        sel = (spec.get("selector") or {}).get("matchLabels") or {}
        if not labels_match(sel, tmpl_labels):
            fail(f"StatefulSet {name}: selector {sel} does not match template labels {tmpl_labels}")
        gov = services.get(spec.get("serviceName"))
        if not gov or gov["spec"].get("clusterIP") != "None":
            fail(f"StatefulSet {name}: serviceName {spec.get('serviceName')!r} is not a headless Service")
        vcts = spec.get("volumeClaimTemplates") or []
        if not vcts:
            fail(f"StatefulSet {name}: no volumeClaimTemplates (RocksDB dir)")
        for v in vcts:
            vs = v.get("spec", {})
            if not vs.get("accessModes") or not (vs.get("resources") or {}).get("requests", {}).get("storage"):
                fail(f"StatefulSet {name}: PVC template {v.get('metadata', {}).get('name')} lacks accessModes/storage")
        pod = tmpl.get("spec", {})
        volumes = {v["name"]: v for v in pod.get("volumes") or []}
        volumes.update({v["metadata"]["name"]: {"pvc": True} for v in vcts})
        for vname, v in volumes.items():
            if "configMap" in v and v["configMap"]["name"] not in configmaps:
                fail(f"StatefulSet {name}: volume {vname} refers to missing ConfigMap {v['configMap']['name']}")
            if "secret" in v and v["secret"]["secretName"] not in secrets:
                fail(f"StatefulSet {name}: volume {vname} refers to missing Secret {v['secret']['secretName']}")
        containers = pod.get("containers") or []
        if not containers:
            fail(f"StatefulSet {name}: no containers")
        for c in containers:
            cn = c.get("name")
            if not c.get("image"):
                fail(f"container {cn}: no image")
            ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
            if not {"grpc", "metrics"} <= set(ports):
                fail(f"container {cn}: needs named ports grpc and metrics, has {sorted(ports)}")
            for probe in ("readinessProbe", "livenessProbe"):
                pr = c.get(probe)
                if not pr:
                    fail(f"container {cn}: no {probe}")
                elif "grpc" not in pr or pr["grpc"].get("port") not in ports.values():
                    fail(f"container {cn}: {probe} is not a native gRPC probe on a container port")
            res = c.get("resources") or {}
            for k in ("requests", "limits"):
                if not (res.get(k) or {}).get("cpu") or not (res.get(k) or {}).get("memory"):
                    fail(f"container {cn}: resources.{k} needs cpu and memory")
            mounts = {m["mountPath"]: m for m in c.get("volumeMounts") or []}
            for m in mounts.values():
                if m["name"] not in volumes:
                    fail(f"container {cn}: volumeMount {m['name']} has no volume")
            if "/data" not in mounts or mounts["/data"]["name"] not in {v["metadata"]["name"] for v in vcts}:
                fail(f"container {cn}: /data is not the PVC template volume")
            for a in c.get("args") or []:
                m = re.match(r"--([a-z0-9-]+)(=|$)", a)
                if m and m.group(1) not in flags:
                    fail(f"container {cn}: unknown server flag {a}")
            # --config file: a mounted ConfigMap key whose lines are known flags.
            for a in c.get("args") or []:
                if not a.startswith("--config="):
                    continue
                path = a.split("=", 1)[1]
                m = mounts.get(path)
                if not m or "configMap" not in volumes.get(m["name"], {}):
                    fail(f"container {cn}: --config {path} is not mounted from a ConfigMap")
                    continue
                cm = configmaps[volumes[m["name"]]["configMap"]["name"]]
                conf = (cm.get("data") or {}).get(m.get("subPath") or os.path.basename(path))
                if conf is None:
                    fail(f"ConfigMap {cm['metadata']['name']}: no key for {path}")
                    continue
                kv = {}
                for line in conf.splitlines():
                    line = line.strip()
                    if not line or line.startswith("#"):
                        continue
                    if "=" not in line:
                        fail(f"ConfigMap {cm['metadata']['name']}: line {line!r} is not key=value")
                        continue
                    k, v = (s.strip() for s in line.split("=", 1))
                    if k.lstrip("-") not in flags:
                        fail(f"ConfigMap {cm['metadata']['name']}: unknown server flag {k}")
                    kv[k.lstrip("-")] = v
                for seed in kv.get("remote-redis", "").split(",") if kv.get("remote-redis") else []:
                    if not re.fullmatch(r"[A-Za-z0-9.-]+:\d+", seed.strip()):
                        fail(f"ConfigMap: remote-redis seed {seed!r} is not host:port")
                if kv.get("data-dir", "").split("/")[1:2] != ["data"]:
                    fail("ConfigMap: data-dir must be on the /data PVC")
                tok = kv.get("auth-token-file")
                if not tok:
                    fail("ConfigMap: no auth-token-file")
                else:
                    d = os.path.dirname(tok)
                    am = mounts.get(d)
                    if not am or "secret" not in volumes.get(am["name"], {}):
                        fail(f"auth-token-file {tok}: its directory is not a mounted Secret")
                    else:
                        sec = secrets[volumes[am["name"]]["secret"]["secretName"]]
                        keys = set(sec.get("data") or {}) | set(sec.get("stringData") or {})
                        if os.path.basename(tok) not in keys:
                            fail(f"Secret {sec['metadata']['name']}: no key {os.path.basename(tok)}")
                listen = kv.get("listen", "")
                if not listen.endswith(":%d" % ports.get("grpc", -1)):
                    fail(f"ConfigMap listen={listen} does not match container port grpc")
                if not kv.get("metrics-listen", "").endswith(":%d" % ports.get("metrics", -1)):
                    fail("ConfigMap metrics-listen does not match container port metrics")
    for svc in services.values():
        sn = svc["metadata"]["name"]
        if not labels_match(svc["spec"].get("selector") or {}, tmpl_labels):
            fail(f"Service {sn}: selector does not match the StatefulSet pods")
        for p in svc["spec"].get("ports") or []:
            if not p.get("name"):
                fail(f"Service {sn}: unnamed port {p}")
    for pdb in one("PodDisruptionBudget"):
        if not labels_match((pdb["spec"].get("selector") or {}).get("matchLabels") or {}, tmpl_labels):
            fail(f"PodDisruptionBudget {pdb['metadata']['name']}: selector does not match the pods")
        if "minAvailable" not in pdb["spec"] and "maxUnavailable" not in pdb["spec"]:
            fail("PodDisruptionBudget: needs minAvailable or maxUnavailable")
    for sm in one("ServiceMonitor"):
        if sm["apiVersion"] != "monitoring.coreos.com/v1":
            fail("ServiceMonitor: apiVersion must be monitoring.coreos.com/v1")
        sel = (sm["spec"].get("selector") or {}).get("matchLabels") or {}
        matched = [s for s in services.values() if labels_match(sel, s["metadata"].get("labels") or {})]
        if len(matched) != 1:
            fail(f"ServiceMonitor: selector matches {len(matched)} Services, want exactly 1")
        for ep in sm["spec"].get("endpoints") or []:
            for s in matched:
                if ep.get("port") not in {p.get("name") for p in s["spec"]["ports"]}:
                    fail(f"ServiceMonitor endpoint port {ep.get('port')!r} is not a port name of Service "
                         f"{s['metadata']['name']}")
    for ing in one("Ingress"):
        ann = ing["metadata"].get("annotations") or {}
        if ann.get("nginx.ingress.kubernetes.io/upstream-hash-by") != "$http_x_infoflow_chunkset":
            fail("Ingress: upstream-hash-by must hash the x-infoflow-chunkset header")
        if ann.get("nginx.ingress.kubernetes.io/backend-protocol") != "GRPC":
            fail("Ingress: backend-protocol must be GRPC")
        for rule in ing["spec"].get("rules") or []:
            for path in rule["http"]["paths"]:
                be = path["backend"]["service"]
                s = services.get(be["name"])
                if not s:
                    fail(f"Ingress: backend Service {be['name']} missing")
                elif be["port"].get("name") not in {p["name"] for p in s["spec"]["ports"]}:
                    fail(f"Ingress: backend port {be['port']} not on Service {be['name']}")
    # GPU overlay.
    gpu = os.path.join(DEPLOY, "k8s", "overlays", "gpu")
    gk = load_yaml_docs(os.path.join(gpu, "kustomization.yaml"))[0]
    for r in gk.get("resources", []):
        if not os.path.isfile(os.path.join(gpu, r, "kustomization.yaml")):
            fail(f"overlays/gpu: resource {r} is not a kustomization")
    names = {(d.get("kind"), d["metadata"]["name"]) for _, d in objs}
    has_gpu = has_dev = False
    for p in gk.get("patches", []):
        pp = os.path.join(gpu, p["path"])
        if not os.path.isfile(pp):
            fail(f"overlays/gpu: patch {p['path']} missing")
            continue
        t = p.get("target") or {}
        if (t.get("kind"), t.get("name")) not in names:
            fail(f"overlays/gpu: patch target {t} not in base")
        for d in load_yaml_docs(pp):
            for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
                if str((c.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu")) == "1":
                    has_gpu = True
                if "--device=cuda" in (c.get("args") or []) or "cuda" in (c.get("args") or []):
                    has_dev = True
                if c.get("name") not in {c2["name"] for s in sts_list
                                          for c2 in s["spec"]["template"]["spec"]["containers"]}:
                    fail(f"overlays/gpu: container {c.get('name')} not in base")
    if not has_gpu:
        fail("overlays/gpu: no nvidia.com/gpu: 1 limit")
    if not has_dev:
        fail("overlays/gpu: no --device=cuda")
    ok(f"k8s: {len(objs)} base objects, GPU overlay")
    check_k8s_sequence_parallel(objs, flags)


# Flags of the sequence-parallel group (issue #28; --dist-interface from
# server/group/group_config.h). Accepted even before server/server_options.cc
# has them, so the manifest can land with the server.
SP_FLAGS = {"world-size", "rank", "dist-init", "dist-timeout-ms", "dist-interface"}


def arg_flags(strings):
    """{flag name: value or None} of every --flag in strings (args, or words of a shell script)."""
    out = {}
    for s in strings:
        for m in re.finditer(r"(?<![\w-])--([a-z0-9][a-z0-9-]*)(?:=(\S*))?", str(s)):
            out[m.group(1)] = m.group(2)
    return out


def check_k8s_sequence_parallel(base_objs, flags):
    """overlays/sequence-parallel: a StatefulSet whose pods are the ranks of one group."""
    ov = "overlays/sequence-parallel"
    d = os.path.join(DEPLOY, "k8s", "overlays", "sequence-parallel")
    kust = load_yaml_docs(os.path.join(d, "kustomization.yaml"))[0]
    objs = []
    uses_base = False
    for r in kust.get("resources", []):
        p = os.path.join(d, r)
        if os.path.isdir(p):
            if os.path.realpath(p) != os.path.realpath(os.path.join(DEPLOY, "k8s", "base")):
                fail(f"{ov}: resource {r} is not ../../base")
            uses_base = True
        elif not os.path.isfile(p):
            fail(f"{ov}: resource {r} does not exist")
        else:
            objs += [x for x in load_yaml_docs(p)]
    for x in objs:
        if not x.get("apiVersion") or not x.get("kind") or not (x.get("metadata") or {}).get("name"):
            fail(f"{ov}: object without apiVersion/kind/metadata.name: {str(x)[:80]}")
    # The objects kubectl applies: base (minus what `$patch: delete` removes) + the overlay's.
    base = {(x["kind"], x["metadata"]["name"]): x for _, x in base_objs} if uses_base else {}
    for p in kust.get("patches", []):
        doc = yaml.safe_load(p["patch"]) if "patch" in p else None
        if "path" in p and not os.path.isfile(os.path.join(d, p["path"])):
            fail(f"{ov}: patch {p['path']} missing")
        if isinstance(doc, dict) and doc.get("$patch") == "delete":
            key = (doc.get("kind"), (doc.get("metadata") or {}).get("name"))
            if key not in base:
                fail(f"{ov}: $patch: delete of {key} which base does not have")
            base.pop(key, None)
    everything = list(base.values()) + objs
    services = {x["metadata"]["name"]: x for x in everything if x.get("kind") == "Service"}
    configmaps = {x["metadata"]["name"]: x for x in everything if x.get("kind") == "ConfigMap"}
    secrets = {x["metadata"]["name"]: x for x in everything if x.get("kind") == "Secret"}
    sts_list = [x for x in objs if x.get("kind") == "StatefulSet"]
    if len(sts_list) != 1:
        fail(f"{ov}: want exactly 1 StatefulSet (the group), has {len(sts_list)}")
        return
    sts = sts_list[0]
    name = sts["metadata"]["name"]
    spec = sts.get("spec") or {}
    tmpl = spec.get("template") or {}
    tmpl_labels = (tmpl.get("metadata") or {}).get("labels") or {}
    if not labels_match((spec.get("selector") or {}).get("matchLabels") or {}, tmpl_labels):
        fail(f"{ov}: StatefulSet {name}: selector does not match template labels {tmpl_labels}")
    # Ranks find rank 0 by its pod DNS name, which needs the governing headless Service.
    headless = spec.get("serviceName")
    gov = services.get(headless)
    if not gov or (gov.get("spec") or {}).get("clusterIP") != "None":
        fail(f"{ov}: StatefulSet {name}: serviceName {headless!r} is not a headless Service")
    elif not labels_match(gov["spec"].get("selector") or {}, tmpl_labels):
        fail(f"{ov}: headless Service {headless}: selector does not match the ranks")
    elif gov["spec"].get("publishNotReadyAddresses") is not True:
        # Rank 0 is unready until every rank joined through its DNS name:
        # without this that name never resolves (deadlock).
        fail(f"{ov}: headless Service {headless}: needs publishNotReadyAddresses: true")
    # OrderedReady would wait for rank 0 to be Ready before starting rank 1.
    if spec.get("podManagementPolicy") != "Parallel":
        fail(f"{ov}: StatefulSet {name}: podManagementPolicy must be Parallel")
    vcts = spec.get("volumeClaimTemplates") or []
    pod = tmpl.get("spec") or {}
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    for vname, v in volumes.items():
        if "configMap" in v and v["configMap"]["name"] not in configmaps:
            fail(f"{ov}: volume {vname} refers to missing ConfigMap {v['configMap']['name']}")
        if "secret" in v and v["secret"]["secretName"] not in secrets:
            fail(f"{ov}: volume {vname} refers to missing Secret {v['secret']['secretName']}")
    containers = pod.get("containers") or []
    if len(containers) != 1:
        fail(f"{ov}: StatefulSet {name}: want 1 container, has {len(containers)}")
        return
    c = containers[0]
    cn = c.get("name")
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    for need in ("grpc", "metrics", "dist"):
        if need not in ports:
            fail(f"{ov}: container {cn}: no containerPort named {need}")
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts") or []}
    if "/data" not in mounts or mounts["/data"]["name"] not in {v["metadata"]["name"] for v in vcts}:
        fail(f"{ov}: container {cn}: /data (--data-dir, one store per rank) is not a PVC template volume")
    for m in mounts.values():
        if m["name"] not in volumes and m["name"] not in {v["metadata"]["name"] for v in vcts}:
            fail(f"{ov}: container {cn}: volumeMount {m['name']} has no volume")
    res = c.get("resources") or {}
    if not (res.get("requests") or {}).get("cpu") or not (res.get("requests") or {}).get("memory"):
        fail(f"{ov}: container {cn}: resources.requests needs cpu and memory (per rank)")
    # Readiness = grpc.health.v1 (rank 0 Ready only with the group complete);
    # liveness/startup must not be: rank 0 is NOT_SERVING while a rank is
    # missing, and restarting it then would break the group for every rank.
    rp = c.get("readinessProbe") or {}
    if "grpc" not in rp or rp["grpc"].get("port") not in ports.values():
        fail(f"{ov}: container {cn}: readinessProbe is not a native gRPC probe on a container port")
    if not c.get("livenessProbe"):
        fail(f"{ov}: container {cn}: no livenessProbe")
    for probe in ("livenessProbe", "startupProbe"):
        pr = c.get(probe) or {}
        if "grpc" in pr:
            fail(f"{ov}: container {cn}: {probe} uses grpc.health.v1, which fails while the group is incomplete")
        tcp = pr.get("tcpSocket")
        if tcp and tcp.get("port") not in set(ports.values()) | set(ports):
            fail(f"{ov}: container {cn}: {probe} tcpSocket port {tcp.get('port')} is not a container port")
    # Flags: in args, and in the shell command that adds --rank.
    cmd = [str(x) for x in c.get("command") or []]
    args = [str(x) for x in c.get("args") or []]
    used = arg_flags(args + cmd)
    for f in sorted(used):
        if f not in flags and f not in SP_FLAGS:
            fail(f"{ov}: container {cn}: unknown server flag --{f}")
    env = {e.get("name") for e in c.get("env") or []}
    for ref in sorted(set(re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", " ".join(args + cmd)))):
        if ref not in env:
            fail(f"{ov}: container {cn}: $({ref}) is not an env var of the container (left unexpanded)")
    if "rank" not in used:
        fail(f"{ov}: container {cn}: no --rank")
    ws = used.get("world-size")
    if ws is None or not ws.isdigit():
        fail(f"{ov}: container {cn}: no --world-size=N")
    elif int(ws) != spec.get("replicas"):
        fail(f"{ov}: StatefulSet {name}: replicas {spec.get('replicas')} != --world-size={ws}")
    di = used.get("dist-init") or ""
    m = re.fullmatch(r"(\S+):(\d+)", di)
    if not m:
        fail(f"{ov}: container {cn}: no --dist-init=HOST:PORT")
    else:
        host, port = m.group(1), int(m.group(2))
        want = f"{name}-0.{headless}"
        if not (host == want or host.startswith(want + ".")):
            fail(f"{ov}: --dist-init host {host} is not rank 0's DNS name {want}[.<ns>.svc...]")
        if port != ports.get("dist"):
            fail(f"{ov}: --dist-init port {port} != containerPort dist {ports.get('dist')}")
    # Clients reach rank 0 only: ranks > 0 answer Query/Ingest FAILED_PRECONDITION.
    rank0 = {"statefulset.kubernetes.io/pod-name": f"{name}-0"}
    clients = [s for s in services.values() if s["metadata"]["name"] != headless]
    if not clients:
        fail(f"{ov}: no client Service for rank 0")
    for svc in clients:
        sn = svc["metadata"]["name"]
        sel = svc["spec"].get("selector") or {}
        if labels_match(sel, tmpl_labels):
            fail(f"{ov}: Service {sn} selects every rank; clients must reach rank 0 only")
        elif svc in objs and sel != rank0:
            fail(f"{ov}: Service {sn}: selector {sel} is not {rank0}")
    for svc in [s for s in services.values() if s in objs]:
        for p in svc["spec"].get("ports") or []:
            tp = p.get("targetPort", p.get("port"))
            if tp not in ports and tp not in ports.values():
                fail(f"{ov}: Service {svc['metadata']['name']}: targetPort {tp} is not a containerPort")
            if not p.get("name"):
                fail(f"{ov}: Service {svc['metadata']['name']}: unnamed port {p}")
    pdbs = [x for x in objs if x.get("kind") == "PodDisruptionBudget"]
    if not pdbs:
        fail(f"{ov}: no PodDisruptionBudget")
    for pdb in pdbs:
        if not labels_match((pdb["spec"].get("selector") or {}).get("matchLabels") or {}, tmpl_labels):
            fail(f"{ov}: PodDisruptionBudget {pdb['metadata']['name']}: selector does not match the ranks")
        if pdb["spec"].get("maxUnavailable") not in (0, 1):
            fail(f"{ov}: PodDisruptionBudget: maxUnavailable must be 0 or 1 (any lost rank stops the group)")
    for sm in [x for x in everything if x.get("kind") == "ServiceMonitor"]:
        sel = (sm["spec"].get("selector") or {}).get("matchLabels") or {}
        matched = [s for s in services.values() if labels_match(sel, s["metadata"].get("labels") or {})]
        if not matched:
            fail(f"{ov}: ServiceMonitor {sm['metadata']['name']} matches no Service")
        for ep in sm["spec"].get("endpoints") or []:
            for s in matched:
                if ep.get("port") not in {p.get("name") for p in s["spec"].get("ports") or []}:
                    fail(f"{ov}: ServiceMonitor port {ep.get('port')!r} is not on Service {s['metadata']['name']}")
    note = ""
    kubectl = shutil.which("kubectl")
    if kubectl:
        r = subprocess.run([kubectl, "kustomize", d], capture_output=True, text=True, timeout=30)
        if r.returncode:
            fail(f"{ov}: kubectl kustomize: {(r.stderr or r.stdout).strip()[:300]}")
        else:
            rendered = {(x["kind"], x["metadata"]["name"]) for x in yaml.safe_load_all(r.stdout) if x}
            expect = {(x["kind"], x["metadata"]["name"]) for x in everything}
            if rendered != expect:
                fail(f"{ov}: kubectl kustomize renders {sorted(rendered)}, expected {sorted(expect)}")
            note = ", kubectl kustomize renders it"
    else:
        note = " (no kubectl: kustomize build not tried)"
    ok(f"k8s: {ov}: StatefulSet {name} x {spec.get('replicas')} ranks, "
       f"{len(everything)} objects{note}")


# ------------------------------------------------------------------- compose
def check_compose():
    if not need_yaml("compose"):
        return
    c = load_yaml_docs(os.path.join(DEPLOY, "compose.yaml"))[0]
    svcs = c.get("services") or {}
    for s in ("infoflow-server", "prometheus", "grafana", "redis"):
        if s not in svcs:
            fail(f"compose.yaml: no service {s}")
    srv = svcs.get("infoflow-server", {})
    flags = server_flag_names()
    for a in srv.get("command") or []:
        m = re.match(r"--([a-z0-9-]+)", a)
        if m and m.group(1) not in flags:
            fail(f"compose.yaml: unknown server flag {a}")
    if "healthcheck" not in srv:
        fail("compose.yaml: infoflow-server has no healthcheck")
    # The shared tier: the server's seeds name the compose Redis service, which
    # runs in cluster mode (the client speaks the cluster protocol only) with
    # an LRU eviction policy and room for MB-sized records.
    seeds = [a.split("=", 1)[1] for a in srv.get("command") or [] if str(a).startswith("--remote-redis=")]
    if not seeds:
        fail("compose.yaml: infoflow-server has no --remote-redis")
    for seed in (seeds[0].split(",") if seeds else []):
        if seed.rsplit(":", 1)[0] not in svcs:
            fail(f"compose.yaml: --remote-redis seed {seed} is not a compose service")
    redis_cmd = " ".join(str(x) for x in (svcs.get("redis", {}).get("command") or []))
    for need in ("--cluster-enabled yes", "--maxmemory-policy allkeys-lru", "--proto-max-bulk-len",
                 "addslotsrange 0 16383"):
        if need not in redis_cmd:
            fail(f"compose.yaml: redis service lacks {need!r}")
    if "redis" not in (srv.get("depends_on") or {}):
        fail("compose.yaml: infoflow-server does not depend on redis")
    if not any(str(v).endswith(":/data") for v in srv.get("volumes") or []):
        fail("compose.yaml: infoflow-server has no /data volume")
    base = DEPLOY
    for name, s in svcs.items():
        for v in s.get("volumes") or []:
            src = str(v).split(":")[0]
            if src.startswith("./") and not os.path.exists(os.path.join(base, src)):
                fail(f"compose.yaml: {name} mounts missing {src}")
        b = s.get("build")
        if b and not os.path.isfile(os.path.join(base, b.get("context", "."), b.get("dockerfile", "Dockerfile"))):
            fail(f"compose.yaml: {name} build dockerfile missing")
    targets = []
    prom = load_yaml_docs(os.path.join(DEPLOY, "prometheus", "prometheus.yml"))[0]
    for sc in prom.get("scrape_configs", []):
        for st in sc.get("static_configs", []):
            targets += st.get("targets", [])
    if not any(t.startswith("infoflow-server:") and t.endswith(":9464") for t in targets):
        fail("prometheus.yml: does not scrape infoflow-server:9464")
    ds_dir = os.path.join(DEPLOY, "grafana", "provisioning", "datasources")
    dss = [d for f in os.listdir(ds_dir) for doc in load_yaml_docs(os.path.join(ds_dir, f))
           for d in doc.get("datasources", [])]
    if not any(d.get("type") == "prometheus" for d in dss):
        fail("grafana: no provisioned prometheus datasource")
    db_dir = os.path.join(DEPLOY, "grafana", "provisioning", "dashboards")
    provs = [p for f in os.listdir(db_dir) for doc in load_yaml_docs(os.path.join(db_dir, f))
             for p in doc.get("providers", [])]
    if not provs:
        fail("grafana: no dashboards provider")
    ok(f"compose: {len(svcs)} services, prometheus targets {targets}")


# -------------------------------------------------------------------- docker
def dockerfile_instructions(path):
    """[(lineno, INSTRUCTION, args)] with continuations joined, comments dropped."""
    out, buf, start = [], "", 0
    with open(path) as f:
        for i, line in enumerate(f, 1):
            s = line.rstrip("\n")
            if not buf and (not s.strip() or s.lstrip().startswith("#")):
                continue
            if buf and s.lstrip().startswith("#"):
                continue
            if not buf:
                start = i
            if s.endswith("\\"):
                buf += s[:-1] + " "
                continue
            buf += s
            parts = buf.strip().split(None, 1)
            out.append((start, parts[0].upper(), parts[1] if len(parts) > 1 else ""))
            buf = ""
    return out


def lint_dockerfile(path):
    name = rel(path)
    ins = dockerfile_instructions(path)
    if not ins:
        fail(f"{name}: empty")
        return
    first = next((x for x in ins if x[1] != "ARG"), None)
    if not first or first[1] != "FROM":
        fail(f"{name}: first instruction (after ARGs) must be FROM")
    stages, stage_users, cur = [], {}, None
    health = False
    for ln, op, args in ins:
        if op == "FROM":
            m = re.match(r"(\S+)(?:\s+AS\s+(\S+))?\s*$", args, re.I)
            if not m:
                fail(f"{name}:{ln}: bad FROM")
                continue
            image, alias = m.group(1), m.group(2)
            if image.lower() in [s.lower() for s in stages]:
                pass  # FROM an earlier stage
            elif not image.startswith("debian:12") and "$" not in image:
                fail(f"{name}:{ln}: base image {image} is not debian:12")
            cur = alias or f"#{len(stages)}"
            stages.append(cur)
            stage_users[cur] = None
        elif op == "USER":
            stage_users[cur] = args.strip()
        elif op == "HEALTHCHECK":
            health = True
            if "infoflow" not in args:
                fail(f"{name}:{ln}: HEALTHCHECK does not use the infoflow CLI")
        elif op == "COPY":
            m = re.search(r"--from=(\S+)", args)
            if m and m.group(1) not in stages:
                fail(f"{name}:{ln}: COPY --from={m.group(1)} is not an earlier stage")
        if op == "RUN":
            if re.search(r"\b(curl|wget)\b[^|;&]*\|\s*(sudo\s+)?(ba|z|da)?sh\b", args):
                fail(f"{name}:{ln}: pipes a download into a shell")
            for script in re.findall(r"(deploy/[\w./-]+\.sh)", args):
                if not os.path.isfile(os.path.join(SRC, script)):
                    fail(f"{name}:{ln}: {script} does not exist")
    if len(stages) < 2:
        fail(f"{name}: not multi-stage")
    runtime = stages[-1] if stages else None
    user = stage_users.get(runtime)
    if not user or user.split(":")[0] in ("root", "0"):
        fail(f"{name}: runtime stage {runtime} does not switch to a non-root USER")
    if not health:
        fail(f"{name}: no HEALTHCHECK")
    text = open(path).read()
    if "install-deps.sh" not in text:
        fail(f"{name}: build stage does not run deploy/install-deps.sh")
    for port in ("50051", "9464"):
        if not re.search(r"^EXPOSE .*\b%s\b" % port, text, re.M):
            fail(f"{name}: does not EXPOSE {port}")
    if not re.search(r"^VOLUME .*/data", text, re.M):
        fail(f"{name}: no VOLUME /data")
    if not re.search(r"--target infoflow-server infoflow\b", text):
        fail(f"{name}: does not build the infoflow-server and infoflow targets")
    runtime_part = text[text.rfind("\nFROM "):]
    if re.search(r"\b[a-z0-9.+-]+-dev\b", re.sub(r"#.*", "", runtime_part)):
        fail(f"{name}: runtime stage installs -dev packages")
    return stages


def check_docker():
    d = os.path.join(DEPLOY, "docker")
    for f in ("Dockerfile", "Dockerfile.cuda"):
        p = os.path.join(d, f)
        if not os.path.isfile(p):
            fail(f"deploy/docker/{f} missing")
            continue
        stages = lint_dockerfile(p)
        ok(f"docker: {f} stages {stages}")
    cuda = open(os.path.join(d, "Dockerfile.cuda")).read()
    if "-DINFOFLOW_CUDA=ON" not in cuda or "Torch_DIR" not in cuda:
        fail("Dockerfile.cuda: must build with -DINFOFLOW_CUDA=ON against Torch_DIR")


def check_scripts():
    for p in walk((".sh",)):
        r = subprocess.run(["bash", "-n", p], capture_output=True, text=True)
        if r.returncode:
            fail(f"{rel(p)}: bash -n: {r.stderr.strip()}")
    ok("scripts: bash -n deploy/*.sh")


# ---------------------------------------------------------------- prometheus
def check_prometheus():
    promtool = shutil.which("promtool")
    if not promtool:
        fail("promtool not found (Debian package prometheus)")
        return
    r = subprocess.run([promtool, "check", "config", os.path.join(DEPLOY, "prometheus", "prometheus.yml")],
                       capture_output=True, text=True, timeout=30)
    if r.returncode:
        fail("promtool check config: " + (r.stdout + r.stderr).strip())
    else:
        ok("prometheus: promtool check config")


# ------------------------------------------------------------------- grafana
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset",
                "and", "or", "unless", "inf", "nan", "le"}


def promql_metric_names(expr):
    e = re.sub(r'"(\\.|[^"\\])*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        tok = m.group(0)
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or tok.lower() in PROMQL_WORDS:
            continue
        if m.start() > 0 and (e[m.start() - 1].isdigit() or e[m.start() - 1] in "$."):
            continue
        names.add(tok)
    return names


def family(name):
    for suf in ("_bucket", "_sum", "_count"):
        if name.endswith(suf):
            return name[: -len(suf)]
    return name


def names_from_source():
    with open(os.path.join(SRC, "server", "metrics.cc")) as f:
        return set(re.findall(r'"(infoflow_[a-z0-9_]+)"', f.read()))


def names_from_scrape():
    """Starts the built server, runs one query so labelled histograms exist,
    scrapes /metrics, SIGTERMs it. Returns (names, note) or (None, why)."""
    server = os.path.join(BIN, "server", "infoflow-server")
    if not os.access(server, os.X_OK):
        return None, f"no built server at {server}"
    tmp = tempfile.mkdtemp(prefix="check-deploy-")
    log = open(os.path.join(tmp, "server.log"), "w+")
    # A shared tier whose only seed is a closed port: the server runs (faults
    # are misses) and exports the infoflow_remote_* families.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    proc = subprocess.Popen([server, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                             "--data-dir", os.path.join(tmp, "kv"), "--threads", "1",
                             "--store-sync", "false", "--remote-redis", f"127.0.0.1:{dead_port}",
                             "--remote-timeout-ms", "100", "--http-listen", "127.0.0.1:0"],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        grpc_port = metrics_port = None
        deadline = time.time() + 40
        while time.time() < deadline and not (grpc_port and metrics_port):
            if proc.poll() is not None:
                log.seek(0)
                return None, "server exited: " + log.read()[-500:]
            time.sleep(0.2)
            log.seek(0)
            text = log.read()
            m = re.search(r"^listening on \S*:(\d+)", text, re.M)
            grpc_port = m and int(m.group(1))
            m = re.search(r"^metrics on http://\S*:(\d+)/metrics", text, re.M)
            metrics_port = m and int(m.group(1))
        if not (grpc_port and metrics_port):
            return None, "server did not log its ports in 40 s"
        note = "scraped /metrics of the built server"
        # One HTTP request, so the HTTP API's response counter exists.
        m = re.search(r"^http on http://\S*:(\d+) ", text, re.M)
        if m:
            urllib.request.urlopen(f"http://127.0.0.1:{m.group(1)}/health", timeout=10).read()
        cli = os.path.join(BIN, "client", "infoflow")
        if os.access(cli, os.X_OK):
            q = subprocess.run([cli, "query", "--server", f"127.0.0.1:{grpc_port}", "--question", "Where?",
                                "--chunk-text", "Alice works in Paris.", "--chunk-text", "Bob is her manager.",
                                "--method", "infoflow", "--ratio", "0.5", "--max-new-tokens", "1",
                                "--timeout-ms", "20000"], capture_output=True, text=True, timeout=30)
            note += " after one query" if q.returncode == 0 else f" (query failed: {q.stderr.strip()[:200]})"
        else:
            note += " (no CLI built: labelled histograms may be absent)"
        body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        names = set()
        for line in body.splitlines():
            m = re.match(r"# TYPE (\S+) ", line) or re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)[{ ]", line)
            if m:
                names.add(family(m.group(1)))
        return names, note
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def check_grafana():
    path = os.path.join(DEPLOY, "grafana", "infoflow.json")
    with open(path) as f:
        dash = json.load(f)
    exprs = []

    def visit(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    exprs.append((p.get("title"), t["expr"]))
            visit(p.get("panels", []))
    visit(dash.get("panels", []))
    for v in (dash.get("templating") or {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if v.get("type") == "query" and q:
            m = re.match(r"label_values\((\w+)", q)
            if m:
                exprs.append((f"variable {v['name']}", m.group(1)))
    if not exprs:
        fail("grafana: dashboard has no PromQL")
        return
    source = names_from_source()
    scraped, note = names_from_scrape()
    if scraped is None:
        print(f"note: {note}; using the metric names in server/metrics.cc")
        exported, how = source, "server/metrics.cc"
    else:
        exported, how = scraped, note
        for n in sorted(source - scraped):
            print(f"note: {n} is in metrics.cc but not in the scrape")
    used = set()
    for title, e in exprs:
        for n in promql_metric_names(e):
            used.add(family(n))
            if family(n) not in exported:
                fail(f"grafana panel {title!r}: metric {n} is not exported ({how}): {e}")
    must = {"infoflow_query_ttft_seconds", "infoflow_recompute_ratio", "infoflow_store_hits_total",
            "infoflow_ingest_tokens_total", "infoflow_inflight_streams", "infoflow_store_bytes",
            "infoflow_remote_hits_total", "infoflow_remote_errors_total", "infoflow_remote_fetch_seconds",
            "infoflow_remote_bytes_total", "infoflow_remote_circuit_state",
            "infoflow_grpc_requests_total", "infoflow_http_responses_total"}
    for n in sorted(must - used):
        fail(f"grafana: dashboard does not show {n}")
    if not any("histogram_quantile" in e and "infoflow_query_ttft_seconds_bucket" in e and "method" in e
               for _, e in exprs):
        fail("grafana: no TTFT quantile by method")
    ok(f"grafana: {len(exprs)} expressions use {len(used)} metrics, all exported (checked against: {how})")


SECTIONS = {"parse": check_parse, "k8s": check_k8s, "compose": check_compose, "docker": check_docker,
            "scripts": check_scripts, "prometheus": check_prometheus, "grafana": check_grafana}


def main():
    wanted = sys.argv[3:] or list(SECTIONS)
    for s in wanted:
        try:
            SECTIONS[s]()
        except Exception as e:  # noqa: BLE001 - a crash in a check is a failure of that check
            fail(f"{s}: {type(e).__name__}: {e}")
    if ERRORS:
        print(f"{len(ERRORS)} failure(s)")
        return 1
    if SKIPPED:
        return 77
    print("all deploy checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
