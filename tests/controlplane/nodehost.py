"""The host side of the `node` test backend: the CNI bridge, containerd's images, and leaving the machine as found.

Stdlib plus grpcio (kcover's own dependency) for the CRI calls. Owns what a real node changes on the
machine and undoing it: the bridge `kcover0` with the pod subnet's gateway address (the only
non-loopback address the backend uses, a network it makes itself), the kernel settings a kubelet and a
bridge change (`Sysctls`, restored at the end), the pod sandboxes left in containerd (stopped and
removed through the CRI, so the CNI plugin releases their addresses and network namespaces), mounts
under the node's directories, kube-proxy's iptables chains, the kubelet's cgroups, and its pod log
directories. `cleanup()` is idempotent and runs both before a start (a run that was killed) and after a
stop, and touches only what the backend makes: paths it owns (marked), its bridge, the network
namespaces and CNI cache entries of its network.

Also: the pod sandbox image (kcover-pause in a one-layer image, written as a docker archive here) and
importing image archives into containerd (`ctr images import`), skipped when the same archive was
imported before.

How it fails: `HostError` with the command and its output; cleanup never raises (it logs what it could
not undo to stderr).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

BRIDGE = "kcover0"
POD_SUBNET = "10.244.0.0/24"
GATEWAY = "10.244.0.1"
CLUSTER_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"
CNI_NETWORK = "kcover"
CNI_BIN = Path("/usr/lib/cni")
KUBELET_ROOT = Path("/var/lib/kubelet")  # the chart's PodResources hostPath and the device-plugin directory
STATE = Path("/run/kcover-node")  # containerd's state and socket, CNI config and IPAM: gone at the end
CONF = STATE / "conf"  # the node's components' configs: a process naming it is the backend's
POD_LOGS = (Path("/var/log/pods"), Path("/var/log/containers"))  # the kubelet's, fixed
CNI_CACHE = Path("/var/lib/cni/results")  # containerd's CNI result cache, fixed
MARKER = ".kcover-test-node"  # a directory holding this file is the backend's to empty
OWNED = STATE / "owned.json"  # directories the backend made (they did not exist before it): removed at the end
PAUSE_IMAGE = "localhost/kcover-pause:1"
CGROUP_ROOT = Path("/sys/fs/cgroup")
# What a kubelet (kernel/panic*, vm/overcommit_memory, kernel/keys/*), the bridge plugin (ip_forward) and
# kube-proxy may set; their values before the backend started are written back after it stopped.
SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
           "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/ip_forward",
           "net/ipv4/conf/all/route_localnet", "net/bridge/bridge-nf-call-iptables")
PACKAGES = ("containerd", "runc", "containernetworking-plugins", "iptables", "conntrack", "socat", "iproute2",
            "podman", "mmdebstrap")
COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "iptables", "conntrack", "socat", "ip")


class HostError(RuntimeError):
    pass


def run(argv: list[str], *, check: bool = True, timeout: float = 120, input: bytes | None = None) -> str:
    proc = subprocess.run(argv, capture_output=True, timeout=timeout, check=False, input=input)
    out = (proc.stdout + proc.stderr).decode(errors="replace")
    if check and proc.returncode != 0:
        raise HostError(f"{' '.join(argv)} failed (rc={proc.returncode}):\n{out[-3000:]}")
    return out


def missing_prerequisites() -> list[str]:
    """Why this machine cannot run a node (empty when it can)."""
    out = []
    if os.geteuid() != 0:
        out.append("not root (a kubelet, containerd and a bridge need root)")
    out += [f"command {c} (Debian: apt-get install {' '.join(PACKAGES)}, or tests/controlplane/node-prereqs.sh)"
            for c in COMMANDS if shutil.which(c) is None]
    out += [f"CNI plugin {CNI_BIN / p} (containernetworking-plugins)" for p in ("bridge", "host-local", "loopback")
            if not (CNI_BIN / p).exists()]
    if KUBELET_ROOT.exists() and not (KUBELET_ROOT / MARKER).exists() and any(KUBELET_ROOT.iterdir()):
        out.append(f"{KUBELET_ROOT} is in use by another kubelet")
    return out


def log(message: str) -> None:
    print(f"[nodehost] {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ kernel settings

class Sysctls:
    """The values of `SYSCTLS` when made; `restore()` writes back those that changed."""

    def __init__(self) -> None:
        self.saved: dict[str, str] = {}
        for name in SYSCTLS:
            with contextlib.suppress(OSError):
                self.saved[name] = (Path("/proc/sys") / name).read_text().strip()

    def restore(self) -> None:
        for name, value in self.saved.items():
            path = Path("/proc/sys") / name
            try:
                if path.read_text().strip() != value:
                    path.write_text(value + "\n")
            except OSError as exc:
                log(f"could not restore {name}={value}: {exc}")


# ------------------------------------------------------------------------------------------ network

def make_bridge() -> None:
    """The CNI bridge, made before anything starts, with the gateway address the API server is reached at."""
    if BRIDGE not in run(["ip", "-o", "link", "show"]):
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    if f"{GATEWAY}/24" not in run(["ip", "-o", "addr", "show", "dev", BRIDGE]):
        run(["ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])


def cni_config(directory: Path, ipam_dir: Path) -> None:
    """The bridge network: host-local addresses in the pod subnet, a default route via the gateway, no
    masquerading (pods talk only to this host and each other)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "10-kcover.conflist").write_text(json.dumps({
        "cniVersion": "1.0.0", "name": CNI_NETWORK, "plugins": [{
            "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
            "ipam": {"type": "host-local", "dataDir": str(ipam_dir),
                     "ranges": [[{"subnet": POD_SUBNET, "gateway": GATEWAY}]], "routes": [{"dst": "0.0.0.0/0"}]}}]},
        indent=2))


# ------------------------------------------------------------------------------------------ images

def pause_archive(binary: Path, out: Path) -> Path:
    """A docker archive of PAUSE_IMAGE: one layer holding `binary` as /pause, its entrypoint (deterministic)."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("pause")
        info.size, info.mode, info.mtime = binary.stat().st_size, 0o755, 0
        with binary.open("rb") as f:
            tar.addfile(info, f)
    layer_bytes = layer.getvalue()
    diff_id = hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux", "created": "1970-01-01T00:00:00Z",
                         "config": {"Entrypoint": ["/pause"]},
                         "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]}}).encode()
    config_id = hashlib.sha256(config).hexdigest()
    manifest = json.dumps([{"Config": f"{config_id}.json", "RepoTags": [PAUSE_IMAGE],
                            "Layers": [f"{diff_id}/layer.tar"]}]).encode()
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in ((f"{diff_id}/layer.tar", layer_bytes), (f"{config_id}.json", config),
                           ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    if not out.exists() or out.read_bytes() != archive.getvalue():  # unchanged: not imported again
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(archive.getvalue())
    return out


def import_images(address: Path, archives: dict[str, Path], stamp: Path) -> dict[str, str]:
    """`ctr images import` each archive whose image is not in containerd from that same archive (by name,
    size and mtime, recorded in `stamp`). Returns image -> "imported" or "present"."""
    seen: dict[str, str] = json.loads(stamp.read_text()) if stamp.exists() else {}
    listed = set(run(["ctr", "--address", str(address), "-n", "k8s.io", "images", "ls", "-q"]).split())
    out = {}
    for image, archive in archives.items():
        identity = f"{archive.resolve()}:{archive.stat().st_size}:{int(archive.stat().st_mtime)}"
        if image in listed and seen.get(image) == identity:
            out[image] = "present"
            continue
        run(["ctr", "--address", str(address), "-n", "k8s.io", "images", "import", "--no-unpack=false",
             str(archive)], timeout=600)
        seen[image] = identity
        out[image] = "imported"
    stamp.write_text(json.dumps(seen, indent=2))
    missing = set(archives) - set(run(["ctr", "--address", str(address), "-n", "k8s.io", "images", "ls", "-q"]).split())
    if missing:
        raise HostError(f"images not in containerd after import: {sorted(missing)}")
    return out


# ------------------------------------------------------------------------------------------ CRI

def _field(number: int, payload: bytes) -> bytes:
    def varint(value: int) -> bytes:
        out = bytearray()
        while True:
            byte, value = value & 0x7F, value >> 7
            out.append(byte | (0x80 if value else 0))
            if not value:
                return bytes(out)
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def remove_sandboxes(address: Path, timeout: float = 60) -> int:
    """Stop and remove every pod sandbox (and its containers) in containerd through the CRI, as a kubelet
    does when a pod goes: the CNI plugin releases the pod's address and network namespace. Returns how many."""
    import grpc

    from kcover import protowire

    if not address.exists():
        return 0
    with grpc.insecure_channel(f"unix://{address}") as channel:
        def call(method: str, body: bytes) -> bytes:
            stub = channel.unary_unary(f"/runtime.v1.RuntimeService/{method}", request_serializer=bytes,
                                       response_deserializer=bytes)
            return bytes(stub(body, timeout=timeout))
        listed = call("ListPodSandbox", b"")
        ids = []
        for number, wire, value in protowire.fields(listed):  # ListPodSandboxResponse.items = 1
            if number == 1 and wire == 2 and isinstance(value, bytes):
                ids += [v.decode() for n, w, v in protowire.fields(value) if n == 1 and w == 2 and isinstance(v, bytes)]
        for sandbox in ids:  # {Stop,Remove}PodSandboxRequest.pod_sandbox_id = 1
            call("StopPodSandbox", _field(1, sandbox.encode()))
            call("RemovePodSandbox", _field(1, sandbox.encode()))
    return len(ids)


# ------------------------------------------------------------------------------------------ cleanup

def mark(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).touch()


def own_absent() -> None:
    """Record the fixed directories a kubelet and containerd write that do not exist yet (the kubelet
    deletes unknown files from its log directories, so they cannot carry the marker)."""
    owned = set(json.loads(OWNED.read_text())) if OWNED.exists() else set()
    owned |= {str(p) for p in (*POD_LOGS, CNI_CACHE) if not p.exists()}
    OWNED.write_text(json.dumps(sorted(owned)))


def _remove_owned() -> None:
    for name in json.loads(OWNED.read_text()) if OWNED.exists() else []:
        path = Path(name)
        if path == CNI_CACHE:  # podman may have put results there since: only an empty one goes
            with contextlib.suppress(OSError):
                path.rmdir()
        elif path.is_dir():
            shutil.rmtree(path)


def _ours(path: Path) -> bool:
    return (path / MARKER).exists()


def _mounts_under(roots: list[Path]) -> list[str]:
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if any(point == str(r) or point.startswith(str(r) + "/") for r in roots):
                out.append(point)
    return sorted(set(out), key=len, reverse=True)


def _processes_naming(text: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(entry.name))
    return pids


def _strays(containerd: str) -> list[int]:
    """The node's processes but containerd: those naming CONF (kubelet, kube-proxy, JobSet), and socat."""
    keep = set(_processes_naming(containerd))
    return [p for p in _processes_naming(str(CONF)) if p not in keep] + _processes_naming(f"bind={GATEWAY},")


def _kill(pids: list[int], grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL what is left after `grace` seconds."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while pids and time.monotonic() < deadline:
        pids = [p for p in pids if Path(f"/proc/{p}").exists() and "zombie" not in _state(p)]
        time.sleep(0.1)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:", 1)[1].split("\n", 1)[0].lower()
    except (OSError, IndexError):
        return "zombie"


def _remove_cgroups() -> None:
    """The kubelet's `kubepods` cgroups, deepest first, where they are empty (cgroupfs driver, v1 and v2)."""
    for top in [CGROUP_ROOT, *(p for p in CGROUP_ROOT.iterdir() if p.is_dir())] if CGROUP_ROOT.exists() else []:
        pods = top / "kubepods"
        if not pods.is_dir():
            continue
        for d in sorted((p for p in pods.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                d.rmdir()
        with contextlib.suppress(OSError):
            pods.rmdir()


def _remove_kube_chains() -> None:
    """Every `KUBE-*` iptables chain (IPv4 and IPv6) and the rules jumping to it: what kube-proxy and the
    kubelet made that `kube-proxy --cleanup` leaves (KUBE-FIREWALL, the canaries)."""
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for table in ("filter", "nat", "mangle", "raw"):
            saved = run([f"{tool}-save", "-t", table], check=False).splitlines()
            chains = [ln[1:].split()[0] for ln in saved if ln.startswith(":KUBE-")]
            for line in saved:
                if line.startswith("-A ") and " -j KUBE-" in line and line.split()[1] not in chains:
                    run([tool, "-t", table, "-D", *shlex.split(line)[1:]], check=False)
            for chain in chains:
                run([tool, "-t", table, "-F", chain], check=False)
            for chain in chains:
                run([tool, "-t", table, "-X", chain], check=False)


def cleanup(*, containerd_root: Path, kube_proxy: Path | None, netns_before: set[str] | None = None) -> None:
    """Undo what a node run left (idempotent; never raises)."""
    address = STATE / "containerd" / "containerd.sock"
    containerd = f"--config {CONF / 'containerd.toml'}"
    steps = [
        # a run that was killed left its processes: the kubelet first (it would recreate the sandboxes)
        ("processes", lambda: _kill(_strays(containerd))),
        ("pod sandboxes", lambda: remove_sandboxes(address, timeout=30) if _processes_naming(containerd) else 0),
        ("containerd", lambda: _kill(_processes_naming(containerd))),
        ("shims", lambda: _kill(_processes_naming(f"-address {address}"))),
        ("kube-proxy's iptables chains", lambda: run([str(kube_proxy), "--cleanup"], check=False)
         if kube_proxy is not None and kube_proxy.exists() else None),
        ("KUBE- iptables chains", _remove_kube_chains),
        ("mounts", lambda: [run(["umount", "-l", m], check=False)
                            for m in _mounts_under([KUBELET_ROOT, STATE, containerd_root])]),
        ("network namespaces", lambda: _remove_netns(netns_before)),
        ("bridge", lambda: run(["ip", "link", "del", BRIDGE], check=False)),
        ("CNI cache", lambda: [p.unlink() for p in CNI_CACHE.glob(f"{CNI_NETWORK}-*")] if CNI_CACHE.is_dir() else None),
        ("directories made", _remove_owned),
        ("kubelet and state directories", lambda: [shutil.rmtree(p) for p in (KUBELET_ROOT, STATE)
                                                   if p.is_dir() and _ours(p)]),
        ("cgroups", _remove_cgroups),
    ]
    for what, step in steps:
        try:
            step()
        except Exception as exc:
            log(f"cleanup of {what} incomplete: {exc}")


def netns_now() -> set[str]:
    return {p.name for p in Path("/run/netns").glob("cni-*")} if Path("/run/netns").is_dir() else set()


def _remove_netns(before: set[str] | None) -> None:
    """CNI network namespaces the run made and its sandboxes did not remove (a run that was killed)."""
    for name in netns_now() - (before or set()):
        path = Path("/run/netns") / name
        run(["umount", "-l", str(path)], check=False)
        with contextlib.suppress(OSError):
            path.unlink()
