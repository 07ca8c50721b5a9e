"""Where a preparation is written and how it is published: one strategy per kind of destination.

    destination = destination_for(final)     # a local directory (or file://), or a prefix on object storage
    out = destination.staging()              # where this preparation writes its shards and manifest
    ... write everything under out ...       # on failure: destination.discard(out)
    destination.publish(manifest, out)       # readers see it only from here on
"""

from __future__ import annotations

import time
import uuid

from ..common import storage
from .manifest import VERSION_PREFIX, Manifest


class LocalDirectory:
    """A directory on this machine or on a volume every node mounts (a path, or file://PATH): written beside
    its final name, then renamed into place (atomically); --force replaces what was there."""

    def __init__(self, final: str, replace: bool):
        self.final, self.replace = str(final).removeprefix("file://"), replace

    def staging(self) -> str:
        """A fresh sibling directory named for this host and process (leftovers of gone ones are removed)."""
        return storage.temporary_sibling(self.final)

    def discard(self, out: str) -> None:
        """Nothing half-written is left behind."""
        storage.remove_dir(out)

    def publish(self, manifest: Manifest, out: str) -> None:
        """Rename it in; without replace, a twin that published the same content first is kept."""
        storage.publish_dir(out, self.final, replace=self.replace)


class ObjectStoreVersions:
    """A prefix on object storage, which cannot be renamed: each preparation writes a version prefix of its own,
    and a pointer written last (final/manifest.json) publishes it. Nothing is deleted: a run that loaded the
    previous version goes on reading it, and an attempt that crashed is never pointed to."""

    def __init__(self, final: str):
        self.final = final

    def staging(self) -> str:
        """A new version prefix inside the final one, named for the time and a random id."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        return storage.join(self.final, f"{VERSION_PREFIX}{stamp}-{uuid.uuid4().hex[:8]}")

    def discard(self, out: str) -> None:
        """Left as it is: no pointer names it, so no reader ever sees it (deleting it is the user's call)."""

    def publish(self, manifest: Manifest, out: str) -> None:
        """Point the final prefix at this version."""
        manifest.write_pointer(self.final)


def destination_for(final: str, replace: bool = False) -> LocalDirectory | ObjectStoreVersions:
    """The strategy for a prepared dataset's final location (replace: `nmt prepare --force` on a local path)."""
    return ObjectStoreVersions(final) if storage.is_uri(final) else LocalDirectory(final, replace)
