"""OpenAPI documents of the simulated API server: `/openapi/v3` and its per-group-version documents.

kubectl downloads them before `create -f`/`apply` to validate what it sends (and for `explain`); a
server without them makes kubectl refuse with "failed to download openapi". The documents are the
real kube-apiserver's, recorded for every group-version the sim serves by scripts/record-sim-documents
(kcover/sim/recorded/openapi-v3, gzip; the Kubernetes version in recorded/VERSION). The index links
each document with the SHA-512 of its bytes as `?hash=`, as kube-apiserver does, so clients cache
them. `/openapi/v2` is not served: kubectl reads it only from servers without v3. A group-version
without a recording is left out of the index. Holds one lazily filled cache per `Documents`.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.resources
from typing import Any

_DIR = "recorded/openapi-v3"


class Documents:
    """The recorded OpenAPI v3 documents, read on first use."""

    def __init__(self) -> None:
        self._docs: dict[str, tuple[bytes, str]] | None = None

    def _load(self) -> dict[str, tuple[bytes, str]]:
        if self._docs is None:
            docs: dict[str, tuple[bytes, str]] = {}
            folder = importlib.resources.files("kcover.sim").joinpath(_DIR)
            for item in folder.iterdir():
                if item.name.endswith(".json.gz"):
                    data = gzip.decompress(item.read_bytes())
                    path = item.name.removesuffix(".json.gz").replace("__", "/")
                    docs[path] = (data, hashlib.sha512(data).hexdigest().upper())
            self._docs = docs
        return self._docs

    def index(self, served: list[str]) -> dict[str, Any]:
        """The `/openapi/v3` discovery document for the group-versions in `served` ("api/v1", "apis/g/v")."""
        docs = self._load()
        return {"paths": {p: {"serverRelativeURL": f"/openapi/v3/{p}?hash={docs[p][1]}"}
                          for p in sorted(served) if p in docs}}

    def document(self, path: str) -> tuple[bytes, str] | None:
        """(JSON bytes, hash) of one group-version's document, or None."""
        return self._load().get(path)


def served_paths(group_versions: dict[str, list[str]]) -> list[str]:
    """The OpenAPI v3 paths of the core group and of `group_versions` (a registry's)."""
    return ["api/v1"] + [f"apis/{g}/{v}" for g, vs in group_versions.items() for v in vs]
