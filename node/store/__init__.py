"""Content-addressed artifact store (specs, datasets, checkpoints)."""

from node.store.manifest import Manifest, chunk_size_for
from node.store.partial import PartialDownload
from node.store.store import ArtifactStore

__all__ = ["ArtifactStore", "Manifest", "PartialDownload", "chunk_size_for"]
