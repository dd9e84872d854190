"""A real, throwaway Kubernetes control plane (etcd + kube-apiserver) for kcover's tests.

Stdlib only (plus the ``openssl`` CLI for key generation). No kubelet, scheduler or
controller-manager run: pods stay Pending, namespaces never finish terminating, and no
``default`` ServiceAccount is created (the ServiceAccount admission plugin is disabled so pods
can be created anyway).

    cp = ControlPlane()
    cp.start()            # builds/reuses binaries, starts etcd + apiserver, installs test CRDs
    cp.kubeconfig_path    # kubeconfig with CA data and the admin bearer token
    cp.request("GET", "/api/v1/namespaces")   # -> (status, parsed JSON body)
    cp.stop()

Run ``python tests/controlplane/server.py`` for a start/stop smoke check with timings.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build.sh"
CRD_DIR = HERE / "crds"

# Feature gates enabled when (and only when) the apiserver binary knows them.
WANTED_FEATURE_GATES = ("ResourceHealthStatus", "ResourceHealthStatusMessage", "DRADeviceTaints",
                        "DRADeviceTaintRules")

_gate_cache: dict[str, list[str]] = {}


class ControlPlaneError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def find_binaries() -> Path:
    """Directory holding ``kube-apiserver`` and ``etcd`` (KCOVER_CONTROLPLANE_BIN or build.sh)."""
    env = os.environ.get("KCOVER_CONTROLPLANE_BIN")
    if env and (Path(env) / "kube-apiserver").is_file() and (Path(env) / "etcd").is_file():
        return Path(env)
    proc = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ControlPlaneError(f"build.sh failed (rc={proc.returncode}):\n{proc.stderr[-6000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    if not lines:
        raise ControlPlaneError(f"build.sh printed no bin dir:\n{proc.stderr[-3000:]}")
    return Path(lines[-1].strip())


def _overridden(argv: list[str], extra: list[str]) -> list[str]:
    """`argv` with `extra` appended, less the `--flag=` entries of `argv` that `extra` sets again: list flags
    (--authorization-mode, --disable-admission-plugins) accumulate rather than replace."""
    names = {a.split("=", 1)[0] for a in extra if a.startswith("--")}
    return [a for a in argv if a.split("=", 1)[0] not in names] + list(extra)


class _Proc:
    """A child process whose combined output goes to a log file."""

    def __init__(self, name: str, argv: list[str], log_path: Path):
        self.name = name
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 -- lives as long as the process it logs
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 60) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(deque(f, maxlen=n))
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        self._log.close()


class ControlPlane:
    """etcd + kube-apiserver on loopback, with an admin token and the kcover test CRDs.

    Attributes after ``start()``: ``url`` (https://127.0.0.1:PORT), ``token`` (admin bearer token,
    user ``admin`` in ``system:masters``), ``kubeconfig_path`` (str), ``ca_path`` (serving cert, also
    the CA), ``etcd_url``, ``bin_dir``, ``feature_gates`` (dict), ``runtime_config`` (list),
    ``startup_seconds`` (float, excludes the binary build).
    """

    def __init__(self, *, bin_dir: str | os.PathLike | None = None, install_crds: bool = True,
                 crd_dir: str | os.PathLike | None = None, extra_apiserver_args: list[str] | None = None,
                 extra_etcd_args: list[str] | None = None, start_timeout: float = 90.0, watch_cache: bool = False):
        self.bin_dir = Path(bin_dir) if bin_dir else None
        self.install_crds = install_crds
        self.crd_dir = Path(crd_dir) if crd_dir else CRD_DIR
        self.extra_apiserver_args = list(extra_apiserver_args or [])
        self.extra_etcd_args = list(extra_etcd_args or [])
        self.start_timeout = start_timeout
        self.watch_cache = watch_cache
        self.tmpdir: Path | None = None
        self.url = ""
        self.etcd_url = ""
        self.token = ""
        self.kubeconfig_path = ""
        self.ca_path = ""
        self.feature_gates: dict[str, bool] = {}
        self.runtime_config: list[str] = []
        self.startup_seconds = 0.0
        self._etcd: _Proc | None = None
        self._apiserver: _Proc | None = None
        self._apiserver_argv: list[str] = []
        self._ssl: ssl.SSLContext | None = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        if self.bin_dir is None:
            self.bin_dir = find_binaries()
        t0 = time.monotonic()
        self.tmpdir = Path(tempfile.mkdtemp(prefix="kcover-cp-"))
        atexit.register(self.stop)
        try:
            self._gen_credentials()
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig()
            if self.install_crds:
                self.apply_crds(sorted(self.crd_dir.glob("*.yaml")))
        except BaseException as e:
            msg = f"control plane failed to start: {e}\n{self.log_tail(60)}"
            self.stop()
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise
            raise ControlPlaneError(msg) from e
        self.startup_seconds = time.monotonic() - t0
        return self

    def stop(self) -> None:
        for p in (self._apiserver, self._etcd):
            if p is not None:
                try:
                    p.stop()
                except Exception:
                    pass
        self._apiserver = self._etcd = None
        if self.tmpdir is not None:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
            self.tmpdir = None
        try:
            atexit.unregister(self.stop)
        except Exception:
            pass

    def log_tail(self, n: int = 60) -> str:
        """The last ``n`` lines of each server's log, labelled."""
        out = []
        for p in (self._etcd, self._apiserver):
            if p is not None:
                state = "running" if p.alive() else f"exited rc={p.popen.returncode}"
                out.append(f"----- {p.name} ({state}), last {n} lines of {p.log_path} -----\n{p.tail(n)}")
        return "\n".join(out)

    # ------------------------------------------------------------------ setup steps
    def _openssl(self, *args: str) -> None:
        proc = subprocess.run(["openssl", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{proc.stdout}")

    def _gen_credentials(self) -> None:
        d = self.tmpdir
        assert d is not None
        self._openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "3650",
                      "-keyout", str(d / "serving.key"), "-out", str(d / "serving.crt"),
                      "-subj", "/CN=127.0.0.1",
                      "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                      "-addext", "basicConstraints=critical,CA:TRUE")
        self._openssl("genrsa", "-out", str(d / "sa.key"), "2048")
        self._openssl("rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub"))
        self.token = secrets.token_hex(24)
        (d / "tokens.csv").write_text(f'{self.token},admin,admin,"system:masters"\n')
        self.ca_path = str(d / "serving.crt")
        ctx = ssl.create_default_context(cafile=self.ca_path)
        ctx.check_hostname = False  # cert is for IP 127.0.0.1; verification of the chain still applies
        self._ssl = ctx

    def _start_etcd(self) -> None:
        assert self.bin_dir is not None
        assert self.tmpdir is not None
        last_err = ""
        for attempt in range(3):
            cport, pport = _free_port(), _free_port()
            self.etcd_url = f"http://127.0.0.1:{cport}"
            peer = f"http://127.0.0.1:{pport}"
            data = self.tmpdir / f"etcd-data-{attempt}"
            argv = [str(self.bin_dir / "etcd"), "--name=kcover", f"--data-dir={data}",
                    f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
                    f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster=kcover={peer}", "--unsafe-no-fsync=true",
                    "--log-level=warn", *self.extra_etcd_args]
            self._etcd = _Proc("etcd", argv, self.tmpdir / f"etcd-{attempt}.log")
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if not self._etcd.alive():
                    break
                try:
                    with urllib.request.urlopen(self.etcd_url + "/health", timeout=2) as r:
                        if json.loads(r.read()).get("health") == "true":
                            return
                except (OSError, ValueError):
                    pass
                time.sleep(0.05)
            last_err = self._etcd.tail(60)
            self._etcd.stop()
            if "address already in use" not in last_err:
                break
        raise ControlPlaneError(f"etcd did not become healthy:\n{last_err}")

    def _known_feature_gates(self) -> list[str]:
        exe = str(self.bin_dir / "kube-apiserver")
        if exe not in _gate_cache:
            proc = subprocess.run([exe, "--help"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            _gate_cache[exe] = re.findall(r"^\s+(?:[a-z-]+:)?([A-Za-z0-9]+)=true\|false", proc.stdout, re.M)
        return _gate_cache[exe]

    def _start_apiserver(self) -> None:
        assert self.bin_dir is not None
        assert self.tmpdir is not None
        known = set(self._known_feature_gates())
        self.feature_gates = {g: True for g in WANTED_FEATURE_GATES if g in known}
        gates = ",".join(f"{g}=true" for g in self.feature_gates)
        # DeviceTaintRule is served from resource.k8s.io/v1beta2 (off by default) from 1.36 on
        # (DRADeviceTaintRules gate), from the alpha v1alpha3 before. If the binary refuses the
        # runtime-config, start without it.
        if "DRADeviceTaintRules" in known:
            runtime = ["resource.k8s.io/v1beta2=true", "resource.k8s.io/v1beta2/devicetaintrules=true"]
        elif "DRADeviceTaints" in known:
            runtime = ["resource.k8s.io/v1alpha3=true"]
        else:
            runtime = []
        d = self.tmpdir
        for attempt in range(5):
            port = _free_port()
            self.url = f"https://127.0.0.1:{port}"
            self.runtime_config = list(runtime)
            argv = [str(self.bin_dir / "kube-apiserver"),
                    f"--etcd-servers={self.etcd_url}",
                    "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
                    f"--tls-cert-file={d / 'serving.crt'}", f"--tls-private-key-file={d / 'serving.key'}",
                    f"--cert-dir={d / 'certs'}",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    f"--service-account-key-file={d / 'sa.pub'}",
                    f"--service-account-signing-key-file={d / 'sa.key'}",
                    "--service-cluster-ip-range=10.96.0.0/16",
                    "--authorization-mode=RBAC",
                    f"--token-auth-file={d / 'tokens.csv'}",
                    "--allow-privileged=true",
                    # No controller-manager creates the "default" ServiceAccount, so pods could not be created.
                    "--disable-admission-plugins=ServiceAccount",
                    "--profiling=false",
                    "--v=1"]
            if gates:
                argv.append(f"--feature-gates={gates}")
            if runtime:
                argv.append("--runtime-config=" + ",".join(runtime))
            # No watch cache for configmaps and pods: their watches go to etcd, so a test can force 410
            # Expired with an etcd compaction (`compact()`); the cache would serve old resourceVersions
            # (the controller detectors' test makes the pod reflector re-list this way). Trade-off: pod
            # watches here get no BOOKMARKs (the cache makes those) and no streaming lists
            # (sendInitialEvents), and pod reads always go to etcd; a production server caches pods, and so
            # does this one with `watch_cache=True` (the fleet bench: `restart_apiserver(while_down=
            # expire_history)` expires every watch there).
            if not self.watch_cache:
                argv.append("--watch-cache-sizes=configmaps#0,pods#0")
            argv = _overridden(argv, self.extra_apiserver_args)
            self._apiserver = _Proc("kube-apiserver", argv, d / f"kube-apiserver-{attempt}.log")
            status = self._wait_ready()
            if status == "ready":
                self._apiserver_argv = argv
                return
            if attempt == 4 or self._etcd is None or not self._etcd.alive():
                raise ControlPlaneError(f"kube-apiserver did not become ready ({status})")
            tail = self._apiserver.tail(200)
            if runtime and ("runtime-config" in tail or "unknown api group" in tail):
                self._apiserver.stop()
                runtime = []
                continue
            if "address already in use" in tail:
                self._apiserver.stop()
                continue
            raise ControlPlaneError(f"kube-apiserver did not become ready ({status})")

    def _wait_ready(self) -> str:
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            if not self._apiserver.alive():
                return f"exited rc={self._apiserver.popen.returncode}"
            if self._etcd is not None and not self._etcd.alive():
                return "etcd exited"
            try:
                status, _ = self.request("GET", "/readyz", timeout=3, raw=True)
                if status == 200:
                    return "ready"
                last = f"readyz {status}"
            except (OSError, ssl.SSLError) as e:
                last = str(e)
            time.sleep(0.1)
        return f"timeout after {self.start_timeout}s ({last})"

    def _write_kubeconfig(self) -> None:
        assert self.tmpdir is not None
        ca = base64.b64encode(Path(self.ca_path).read_bytes()).decode()
        cfg = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "kcover", "cluster": {"server": self.url, "certificate-authority-data": ca,
                                                         "tls-server-name": "127.0.0.1"}}],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [{"name": "kcover", "context": {"cluster": "kcover", "user": "admin",
                                                        "namespace": "default"}}],
            "current-context": "kcover",
        }
        p = self.tmpdir / "kubeconfig"
        p.write_text(json.dumps(cfg, indent=2))  # JSON is valid YAML
        self.kubeconfig_path = str(p)

    # ------------------------------------------------------------------ API helpers
    def request(self, method: str, path: str, body=None, *, content_type: str | None = None,
                timeout: float = 30, raw: bool = False, accept: str = "application/json"):
        """One authenticated API call as admin. Returns ``(status, body)``: body is parsed JSON
        (or bytes when ``raw`` or not JSON). HTTP errors are returned, not raised."""
        data = None
        headers = {"Authorization": f"Bearer {self.token}", "Accept": accept}
        if body is not None:
            if isinstance(body, (bytes, str)):
                data = body.encode() if isinstance(body, str) else body
            else:
                data = json.dumps(body).encode()
            headers["Content-Type"] = content_type or "application/json"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=timeout) as r:
                status, payload = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, payload = e.code, e.read()
        if raw:
            return status, payload
        try:
            return status, json.loads(payload)
        except ValueError:
            return status, payload

    def restart_apiserver(self, down_seconds: float = 1.0, *, while_down: Callable[[], object] | None = None) -> float:
        """Stop kube-apiserver (SIGTERM, as a rollout does), call `while_down` (e.g. `expire_history`), leave it
        down `down_seconds`, and start it again with the same arguments and port (etcd keeps running).
        Returns the seconds until it was ready again."""
        assert self._apiserver is not None
        assert self.tmpdir is not None
        self._apiserver.stop()
        if while_down is not None:
            while_down()
        time.sleep(down_seconds)
        t0 = time.monotonic()
        self._restarts = getattr(self, "_restarts", 0) + 1
        self._apiserver = _Proc("kube-apiserver", self._apiserver_argv,
                                self.tmpdir / f"kube-apiserver-restart-{self._restarts}.log")
        status = self._wait_ready()
        if status != "ready":
            raise ControlPlaneError(f"kube-apiserver did not come back ({status})\n{self.log_tail(60)}")
        return time.monotonic() - t0

    def compact(self) -> int:
        """Compact etcd's history up to its current revision (what kube-apiserver does every 5 minutes),
        so a watch from an older resourceVersion gets 410 Expired. Returns the revision compacted to."""
        def post(path: str, body: dict) -> dict:
            req = urllib.request.Request(self.etcd_url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read())
        revision = int(post("/v3/kv/range", {"key": "AA==", "limit": 1})["header"]["revision"])
        post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def expire_history(self) -> int:
        """With kube-apiserver stopped: write one key to etcd (outside the API server's prefix), then compact
        to that write's revision. Every resourceVersion a client holds is then older than the compaction,
        the newest it could have been told included (a graceful shutdown sends watchers a last BOOKMARK,
        which `compact()` before a restart can fall behind, letting a watch resume without a re-list), so
        each watch resumed against the restarted server gets 410 and lists again. Returns the revision."""
        def post(path: str, body: dict) -> dict:
            req = urllib.request.Request(self.etcd_url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
            with urllib.request.urlopen(req, timeout=10) as r:
                return json.loads(r.read())
        key = base64.b64encode(b"/kcover-tests/expire-history").decode()
        value = base64.b64encode(str(time.time()).encode()).decode()
        revision = int(post("/v3/kv/put", {"key": key, "value": value})["header"]["revision"])
        post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        return revision

    def version(self) -> dict:
        """The ``/version`` document (``gitVersion`` etc.)."""
        status, body = self.request("GET", "/version")
        if status != 200:
            raise ControlPlaneError(f"/version answered {status}: {body!r}")
        return body

    def apply_crds(self, paths, timeout: float = 60) -> list[str]:
        """Create the CRDs in the given YAML files (one CRD per file; the apiserver parses YAML)
        and wait until each is Established and served. Returns the CRD names."""
        names = []
        for p in paths:
            text = Path(p).read_text()
            m = re.search(r"^metadata:\s*\n\s+name:\s*(\S+)", text, re.M)
            if not m:
                raise ControlPlaneError(f"{p}: no metadata.name")
            status, body = self.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                                        text, content_type="application/yaml")
            if status not in (201, 409):
                raise ControlPlaneError(f"creating CRD from {p}: HTTP {status}: {body!r}")
            names.append(m.group(1))
        deadline = time.monotonic() + timeout
        pending = list(names)
        while pending:
            name = pending[0]
            status, crd = self.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
            ok = status == 200 and any(c.get("type") == "Established" and c.get("status") == "True"
                                       for c in (crd.get("status") or {}).get("conditions") or [])
            if ok:
                spec = crd["spec"]
                version = next(v["name"] for v in spec["versions"] if v.get("served"))
                s, disc = self.request("GET", f"/apis/{spec['group']}/{version}")
                ok = s == 200 and any(r.get("name") == spec["names"]["plural"] for r in disc.get("resources", []))
            if ok:  # established is not enough: the first lists answer 429 "storage is (re)initializing"
                s, _ = self.request("GET", f"/apis/{spec['group']}/{version}/{spec['names']['plural']}?limit=1")
                ok = s == 200
            if ok:
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"CRD {name} not established within {timeout}s: {crd!r}")
            time.sleep(0.05)
        return names


def main() -> int:
    t0 = time.monotonic()
    bin_dir = find_binaries()
    t_bin = time.monotonic() - t0
    cp = ControlPlane(bin_dir=bin_dir)
    cp.start()
    try:
        v = cp.version()
        print(f"binaries:   {bin_dir} ({t_bin:.1f}s to find/build)")
        print(f"url:        {cp.url}")
        print(f"kubeconfig: {cp.kubeconfig_path}")
        print(f"version:    {v.get('gitVersion')}")
        print(f"gates:      {','.join(cp.feature_gates) or '(none)'}")
        print(f"runtime:    {','.join(cp.runtime_config) or '(none)'}")
        print(f"startup:    {cp.startup_seconds:.2f}s (etcd + apiserver ready + CRDs established)")
        if "--hold" in sys.argv:
            print("holding; Ctrl-C to stop", flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                pass
    finally:
        t1 = time.monotonic()
        cp.stop()
        print(f"stop:       {time.monotonic() - t1:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
