"""The store's names: `refs.json`, name -> manifest digest, and finding an image by reference.

```
{"version": 1, "refs": {"<key>": {"digest": "sha256:…", "source": "pull|import|build",
                                  "updated": "…Z", "index_digest": "sha256:…"?,
                                  "pulled_from": {"registry": "docker.io",
                                                  "endpoint": "https://…/v2",
                                                  "mirror": true|false,
                                                  "answered": "sha256:…"}?}}}
```

`pulled_from` (a pull only): the endpoint that answered the reference (a mirror, or
the registry itself) and the digest it answered (the index's, for an index).

A key is a pulled reference as it was pulled (`docker.io/library/python:3.12`),
or a local tag (`tkbox/default`). The file is read whole, checked, and
replaced atomically under `locks/refs.lock`; a damaged file is a `HostError`
that says what to do, never a crash.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from pathlib import Path
from typing import Any

from tkbox.errors import HostError, RegistryError
from tkbox.image import oci
from tkbox.image._fs import Lock, TempArea, host_error, publish, temp_file
from tkbox.image.blobs import BlobStore
from tkbox.image.reference import DigestRef, LayoutRef, parse_reference

Entry = dict[str, Any]


class Names:
    """`<root>/refs.json`: read, change and search the store's names."""

    def __init__(self, root: Path, tmp: TempArea, blobs: BlobStore) -> None:
        self.path = root / "refs.json"
        self._lock_path = root / "locks" / "refs.lock"
        self._tmp = tmp
        self._blobs = blobs

    def read(self) -> dict[str, Entry]:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise host_error(e, "reading the image names") from None
        try:
            obj = json.loads(data)
            refs = obj["refs"]
            if obj.get("version") != 1 or not isinstance(refs, dict):
                raise ValueError("bad version")
            for k, v in refs.items():
                oci.check_digest(v["digest"])
                if not isinstance(k, str):
                    raise ValueError("bad key")
                if v.get("pulled_from") is not None:
                    check_pulled_from(v["pulled_from"])
        except (ValueError, KeyError, TypeError, RegistryError):
            raise HostError(f"{self.path} is damaged; move it away and pull or import "
                            "the images again") from None
        return refs

    def update(self, change: dict[str, Entry | None]) -> None:
        """Set (or, with None, remove) names, atomically and under the names' lock."""
        with Lock(self._lock_path):
            refs = self.read()
            for k, v in change.items():
                if v is None:
                    refs.pop(k, None)
                else:
                    refs[k] = v
            body = json.dumps({"version": 1, "refs": refs}, indent=1, sort_keys=True).encode()
            try:
                with temp_file(self._tmp, "refs") as (tmp, f):
                    f.write(body)
                    f.flush()
                    os.fsync(f.fileno())
                    f.close()
                    publish(tmp, self.path)
            except OSError as e:
                raise host_error(e, "saving the image names") from None

    def set(self, key: str, digest: str, source: str, index_digest: str | None = None,
            pulled_from: dict[str, Any] | None = None) -> None:
        now = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        entry: Entry = {"digest": digest, "source": source, "updated": now}
        if index_digest:
            entry["index_digest"] = index_digest
        if pulled_from is not None:
            entry["pulled_from"] = pulled_from
        self.update({key: entry})

    def find(self, ref: str) -> tuple[str, Entry] | None:
        """(key, entry) of a stored image named `ref`, without any network."""
        parsed = parse_reference(ref)
        refs = self.read()
        if isinstance(parsed, DigestRef):
            for key, entry in sorted(refs.items()):
                if parsed.digest in (entry["digest"], entry.get("index_digest")):
                    return key, entry
            if self._blobs.has_blob(parsed.digest):
                return parsed.digest, {"digest": parsed.digest, "source": "digest"}
            return None
        if isinstance(parsed, LayoutRef):
            return None
        if parsed.local_key is not None and parsed.local_key in refs:
            return parsed.local_key, refs[parsed.local_key]
        key = str(parsed)
        if key in refs:
            return key, refs[key]
        if parsed.digest is not None:
            for k, entry in sorted(refs.items()):
                if k.startswith(parsed.name + ":") or k.startswith(parsed.name + "@"):
                    if parsed.digest in (entry["digest"], entry.get("index_digest")):
                        return k, entry
        return None


def check_pulled_from(value: object) -> dict[str, Any]:
    """A name's `pulled_from`, checked as it is written and read back (ValueError)."""
    if not isinstance(value, dict) or set(value) != {"registry", "endpoint", "mirror",
                                                      "answered"}:
        raise ValueError("bad pulled_from")
    registry, endpoint = value["registry"], value["endpoint"]
    if not (isinstance(registry, str) and 0 < len(registry) <= 300 and registry.isprintable()
            and isinstance(endpoint, str) and 0 < len(endpoint) <= 2400
            and endpoint.startswith("https://") and endpoint.isprintable()
            and isinstance(value["mirror"], bool)):
        raise ValueError("bad pulled_from")
    oci.check_digest(value["answered"])
    return value
