"""The Kubernetes manifests of deploy/kubernetes (docs/fleet.md, "Kubernetes"): each one
passes `kubectl apply --dry-run=client`, the node pod keeps the settings an unprivileged
lockbox needs and no more (a user namespace, an unmasked /proc, no privilege, every
capability dropped, the shipped seccomp profile, /healthz probes, the token from a Secret),
and `lockbox serve` makes and runs sandboxes under the shipped seccomp profile.

kubectl's client-side dry run still asks an API server which resources the manifests' kinds
are: a stub on 127.0.0.1 answers its discovery requests (and 404 for the objects, so each is
"created"). It does not validate fields against the API's schema (that needs a real API
server): the fields that matter are checked here by reading the YAML."""

import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import need

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEPLOY = os.path.join(ROOT, "deploy", "kubernetes")
MANIFESTS = sorted(f for f in os.listdir(DEPLOY) if f.endswith(".yaml"))
PROFILE = os.path.join(DEPLOY, "seccomp", "lockbox.json")

try:
    import yaml  # PyYAML: Ray's dependency, so in the test venv
except ImportError:
    yaml = None


def load(name):
    need(yaml is not None, "PyYAML (pip install pyyaml)")
    with open(os.path.join(DEPLOY, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def objects(kind):
    found = [d for name in MANIFESTS for d in load(name) if d["kind"] == kind]
    assert found, f"no {kind} in deploy/kubernetes"
    return found


# -- kubectl apply --dry-run=client ---------------------------------------------------------

# What the manifests use, as an API server's discovery lists it: group/version -> kinds.
RESOURCES = {
    "v1": [("Namespace", "namespaces", False), ("Service", "services", True), ("Secret", "secrets", True)],
    "apps/v1": [("DaemonSet", "daemonsets", True), ("Deployment", "deployments", True)],
    "networking.k8s.io/v1": [("NetworkPolicy", "networkpolicies", True)],
}


class _Discovery(BaseHTTPRequestHandler):
    """Answers kubectl's discovery (legacy, unaggregated) and 404 for any object."""

    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # http.server's name
        path = self.path.split("?")[0].rstrip("/")
        if path == "/api":
            return self._send(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": self.headers.get("Host", "")}]})
        if path == "/apis":
            groups = [{"name": gv.split("/")[0], "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                       "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]}}
                      for gv in RESOURCES if "/" in gv]
            return self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        for gv, kinds in RESOURCES.items():
            if path == ("/api/" if gv == "v1" else "/apis/") + gv:
                return self._send(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv,
                                        "resources": [{"name": plural, "singularName": kind.lower(),
                                                       "namespaced": namespaced, "kind": kind,
                                                       "verbs": ["create", "get", "list", "patch", "update"]}
                                                      for kind, plural, namespaced in kinds]})
        return self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                                "code": 404, "message": f"{path} not found"})

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def api_server(tmp_path_factory):
    """A kubeconfig pointing at the discovery stub."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Discovery)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = tmp_path_factory.mktemp("kube") / "config"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "stub",
        "clusters": [{"name": "stub", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
        "users": [{"name": "stub", "user": {}}],
        "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "stub"}}],
    }))
    try:
        yield str(config)
    finally:
        server.shutdown()


@pytest.mark.parametrize("manifest", MANIFESTS)
def test_each_manifest_passes_kubectl_apply_dry_run(manifest, api_server, tmp_path):
    kubectl = shutil.which("kubectl")
    need(kubectl is not None, "kubectl (the Kubernetes client)")
    env = {**os.environ, "KUBECONFIG": api_server, "HOME": str(tmp_path)}
    out = subprocess.run([kubectl, "apply", "--dry-run=client", "--validate=false", "-f",
                          os.path.join(DEPLOY, manifest)], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    for doc in load(manifest):
        assert f"{doc['metadata']['name']} created (dry run)" in out.stdout, out.stdout


def test_kubectl_dry_run_refuses_a_broken_manifest(api_server, tmp_path):
    """The dry run above is not vacuous: a manifest of an unknown kind, or not YAML, fails."""
    kubectl = shutil.which("kubectl")
    need(kubectl is not None, "kubectl (the Kubernetes client)")
    env = {**os.environ, "KUBECONFIG": api_server, "HOME": str(tmp_path)}
    for text in ("apiVersion: apps/v1\nkind: DaemonSett\nmetadata: {name: x}\n", "kind: [unclosed\n"):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        out = subprocess.run([kubectl, "apply", "--dry-run=client", "--validate=false", "-f", str(bad)],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode != 0, out.stdout


# -- what the node pod is allowed ---------------------------------------------------------


def pod_spec():
    (ds,) = objects("DaemonSet")
    return ds, ds["spec"]["template"]["spec"]


def test_the_node_pod_runs_in_a_user_namespace_without_privilege():
    _, spec = pod_spec()
    assert spec["hostUsers"] is False
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        assert not spec.get(host), host
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    containers = spec["containers"] + spec.get("initContainers", [])
    assert containers
    for c in containers:
        sc = c["securityContext"]
        assert sc.get("privileged") is not True, c["name"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"], c["name"]
        assert not sc["capabilities"].get("add"), c["name"]
        assert sc["procMount"] == "Unmasked", c["name"]
        assert sc["readOnlyRootFilesystem"] is True, c["name"]
    # Nothing of the node's own filesystem by default (a hostPath state dir is an opt-in).
    assert not [v for v in spec["volumes"] if "hostPath" in v]


def test_the_node_pod_uses_the_shipped_seccomp_profile():
    _, spec = pod_spec()
    profile = spec["securityContext"]["seccompProfile"]
    assert profile["type"] == "Localhost"
    for c in spec["containers"]:
        assert c["securityContext"].get("seccompProfile", profile) == profile
    # Installed on each node as /var/lib/kubelet/seccomp/<localhostProfile>: the shipped file.
    assert os.path.basename(profile["localhostProfile"]) == os.path.basename(PROFILE)
    with open(PROFILE) as f:
        shipped = json.load(f)
    assert shipped["defaultAction"] == "SCMP_ACT_ALLOW"
    denied = {n for rule in shipped["syscalls"] for n in rule["names"]}
    assert all(rule["action"] == "SCMP_ACT_ERRNO" for rule in shipped["syscalls"])
    # What lockbox itself needs to make a sandbox is never denied.
    needed = {"clone", "clone3", "unshare", "setns", "mount", "umount2", "pivot_root", "open_tree", "move_mount",
              "fsopen", "fsconfig", "fsmount", "mount_setattr", "sethostname", "seccomp", "ioctl",
              "process_vm_readv", "pidfd_open", "pidfd_getfd", "landlock_create_ruleset", "landlock_add_rule",
              "landlock_restrict_self"}
    assert not denied & needed, denied & needed
    assert {"bpf", "keyctl", "io_uring_setup", "kexec_load", "init_module", "userfaultfd"} <= denied
    # In step with lockbox's own filter: what it denies outright in every sandbox, less the
    # calls lockbox makes to set a sandbox up.
    with open(os.path.join(ROOT, "crates", "lockbox-confine", "src", "seccomp.rs")) as f:
        src = f.read()
    body = src[src.index("pub fn denied()"):src.index("/// A syscall reviewed")]
    outright = {name for name, cond in re.findall(r"deny!\(\s*([a-z_0-9]+)(\s+if\b)?", body) if not cond}
    setup = {"mount", "umount2", "pivot_root", "chroot", "setns", "open_tree", "open_tree_attr", "move_mount",
             "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr"}
    assert denied == outright - setup, (sorted(denied - outright), sorted(outright - setup - denied))


def test_the_node_serves_healthz_with_its_token_from_a_secret():
    _, spec = pod_spec()
    (c,) = spec["containers"]
    args = dict(a.split("=", 1) for a in c["args"] if a.startswith("--") and "=" in a)
    port = int(args["--listen"].rsplit(":", 1)[1])
    (named,) = [p for p in c["ports"] if p["containerPort"] == port]
    for probe in ("readinessProbe", "livenessProbe"):
        get = c[probe]["httpGet"]
        assert get["path"] == "/healthz" and get["port"] in (port, named["name"]), probe
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    token = [n for n, m in mounts.items() if args["--token-file"].startswith(m["mountPath"] + "/")]
    assert token and "secret" in volumes[token[0]], args["--token-file"]
    assert mounts[token[0]]["readOnly"] is True
    assert volumes[token[0]]["secret"]["defaultMode"] & 0o007 == 0  # not readable by others
    state = [n for n, m in mounts.items() if m["mountPath"] == args["--state-dir"]]
    assert state and "emptyDir" in volumes[state[0]], args["--state-dir"]
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]


def test_the_headless_service_and_network_policy_select_the_node_pods():
    ds, spec = pod_spec()
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (svc,) = [s for s in objects("Service") if s["spec"].get("clusterIP") == "None"]
    assert svc["spec"]["selector"].items() <= labels.items()
    (c,) = spec["containers"]
    assert {p["targetPort"] for p in svc["spec"]["ports"]} <= {p["name"] for p in c["ports"]}
    (policy,) = objects("NetworkPolicy")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert all(o["metadata"]["namespace"] == ds["metadata"]["namespace"] for o in (svc, policy))


def test_the_router_finds_the_nodes_through_the_headless_service_and_may_reach_them():
    """deploy/kubernetes/router.yaml: `python -m lockbox.fleet router --nodes-dns` on the
    headless Service's name and port, labelled so the nodes' NetworkPolicy lets it in, with
    both tokens from Secrets and its store's URL from one, and no privilege at all."""
    ds, _ = pod_spec()
    (router,) = objects("Deployment")
    spec = router["spec"]["template"]["spec"]
    labels = router["spec"]["template"]["metadata"]["labels"]
    assert router["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert router["spec"]["replicas"] >= 2  # they share the placements in PostgreSQL
    (policy,) = objects("NetworkPolicy")
    (allowed,) = policy["spec"]["ingress"][0]["from"]
    assert allowed["podSelector"]["matchLabels"].items() <= labels.items()
    (c,) = spec["containers"]
    assert c["command"][-3:] == ["-m", "lockbox.fleet", "router"]
    args = dict(a.split("=", 1) for a in c["args"] if a.startswith("--") and "=" in a)
    (headless,) = [s for s in objects("Service") if s["spec"].get("clusterIP") == "None"]
    name, port = args["--nodes-dns"].rsplit(":", 1)
    assert name.split(".")[:2] == [headless["metadata"]["name"], headless["metadata"]["namespace"]]
    assert int(port) in {p["port"] for p in headless["spec"]["ports"]}
    node_args = dict(a.split("=", 1) for a in ds["spec"]["template"]["spec"]["containers"][0]["args"] if "=" in a)
    assert args["--node-capacity"] == node_args["--max-sandboxes"]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    for option, secret in (("--token-file", "lockbox-router-token"), ("--node-token-file", "lockbox-token")):
        assert secrets[mounts[os.path.dirname(args[option])]] == secret, option
    (store,) = [e for e in c["env"] if e["name"] == "LOCKBOX_FLEET_STORE"]
    assert store["valueFrom"]["secretKeyRef"]["name"] == "lockbox-router-store"
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["readOnlyRootFilesystem"] is True and spec["securityContext"]["runAsNonRoot"] is True
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/healthz"
    (front,) = [s for s in objects("Service") if s["metadata"]["name"] == "lockbox-router"]
    assert front["spec"]["selector"].items() <= labels.items()


# -- lockbox under the shipped seccomp profile ---------------------------------------------

# Loads the profile as a runtime does (default allow, the listed calls EPERM; names this
# libseccomp does not know are skipped, as runc skips them), then execs the command.
LOADER = r"""
import json, os, sys, seccomp
spec = json.load(open(sys.argv[1]))
f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
for arch in (seccomp.Arch.X86, seccomp.Arch.X32):
    try:
        f.add_arch(arch)
    except Exception:
        pass
for rule in spec["syscalls"]:
    for name in rule["names"]:
        try:
            f.add_rule(seccomp.ERRNO(rule["errnoRet"]), name)
        except (RuntimeError, ValueError):
            pass
f.load()
os.execvp(sys.argv[2], sys.argv[2:])
"""


def under_profile(argv, **kw):
    """argv run under the shipped profile; as uid 65534 (the pod's runAsUser) when root."""
    need(sys.platform == "linux" and os.uname().machine == "x86_64", "Linux on x86_64")
    probe = subprocess.run(["/usr/bin/python3", "-c", "import seccomp"], capture_output=True)
    need(probe.returncode == 0, "libseccomp's Python binding for /usr/bin/python3 (apt-get install python3-seccomp)")
    prefix = []
    if os.geteuid() == 0:
        need(shutil.which("setpriv") is not None, "setpriv (util-linux)")
        prefix = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    return [*prefix, "/usr/bin/python3", "-c", LOADER, PROFILE, *argv]


def test_lockbox_serve_makes_and_runs_sandboxes_under_the_shipped_seccomp_profile():
    import console_util

    binary = console_util.server_binary()
    need(os.path.exists(binary), f"the lockbox binary ({binary}; cargo build -p lockbox-cli)")
    # Not under pytest's tmp_path (0700, root's): uid 65534 must reach it.
    top = tempfile.mkdtemp(prefix="lockbox-k8s-seccomp-")
    os.chmod(top, 0o755)
    state = os.path.join(top, "state")
    os.mkdir(state)
    if os.geteuid() == 0:
        os.chown(state, 65534, 65534)
    proc = subprocess.Popen(under_profile([binary, "serve", "--listen", "127.0.0.1:0", "--state-dir", state,
                                           "--print-token", "--ports-listen", "off", "--pool", "0"]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first, proc.stderr.read()
        line = json.loads(first)
        host, port = line["listen"].rsplit(":", 1)
        auth = {"Authorization": f"Bearer {line['token']}", "Content-Type": "application/json"}

        def call(method, path, body=None, headers=auth):
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            try:
                conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                assert resp.status < 300, (resp.status, data)
                return json.loads(data or b"null")
            finally:
                conn.close()

        assert call("GET", "/healthz", headers={})["status"] == "ok"
        box = call("POST", "/v1/sandboxes", {})
        ran = call("POST", f"/v1/sandboxes/{box['id']}/exec",
                   {"command": "echo $(id -u) && grep -c . /proc/self/status >/dev/null && echo ok"})
        assert ran["exit_code"] == 0 and ran["stdout"].endswith("ok\n"), ran
        call("DELETE", f"/v1/sandboxes/{box['id']}")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(top, ignore_errors=True)


def test_the_shipped_seccomp_profile_denies_what_it_lists():
    # x86_64 numbers: keyctl, bpf, io_uring_setup; then unshare(0), which must stay allowed.
    code = ("import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "for nr in (250, 321, 425, 272):\n"
            "    ctypes.set_errno(0); r = libc.syscall(nr, 0, 0, 0, 0, 0)\n"
            "    print(nr, r, ctypes.get_errno())\n")
    out = subprocess.run(under_profile(["/usr/bin/python3", "-c", code]), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = {int(nr): (int(r), int(e)) for nr, r, e in (line.split() for line in out.stdout.splitlines())}
    eperm = 1
    assert got[250] == (-1, eperm) and got[321] == (-1, eperm) and got[425] == (-1, eperm), got
    assert got[272] == (0, 0), got
