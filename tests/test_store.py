"""Artifact store: content addressing, atomic writes, manifests, resumable parts, GC, limits."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from node.errors import ArtifactNotFound, ArtifactTooLarge, IntegrityError
from node.store import ArtifactStore, Manifest
from node.store.manifest import MiB

DATA = os.urandom(3 * MiB + 12345)  # 4 chunks of 1 MiB, the last one short


def test_put_open_manifest(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "s")
    aid = store.put_bytes(DATA)
    assert aid == hashlib.sha256(DATA).hexdigest()
    assert store.has(aid) and store.path(aid).read_bytes() == DATA
    with store.open(aid) as fh:
        assert fh.read() == DATA
    m = store.manifest(aid)
    assert m.size == len(DATA) and m.chunk_size == MiB and m.chunk_count == 4
    assert m.chunks[1] == hashlib.sha256(DATA[MiB:2 * MiB]).hexdigest()
    assert Manifest.from_bytes(m.to_bytes()).manifest_hash == m.manifest_hash
    src = tmp_path / "f.bin"
    src.write_bytes(DATA)
    assert store.put_file(src) == aid  # idempotent
    assert store.read_range(aid, 5, 10) == DATA[5:15]
    with pytest.raises(ArtifactNotFound):
        store.open("0" * 64)


def test_manifest_rejects_extra_fields_and_wrong_counts() -> None:
    good = {"artifact_id": "a" * 64, "size": MiB + 1, "chunk_size": MiB,
            "chunks": ["b" * 64, "c" * 64]}
    Manifest.model_validate(good)
    for bad in ({**good, "extra": 1}, {**good, "chunks": ["b" * 64]},
                {**good, "chunk_size": 1024}):
        with pytest.raises(ValueError):
            Manifest.model_validate(bad)


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    """A source that changes mid-copy (or any error) leaves no object and no temp file."""
    store = ArtifactStore(tmp_path / "s", max_size=2 * MiB)
    with pytest.raises(ArtifactTooLarge):
        store.put_bytes(DATA)
    src = tmp_path / "big"
    src.write_bytes(DATA[: MiB])
    store.max_size = MiB // 2
    with pytest.raises(ArtifactTooLarge):
        store.put_file(src)
    assert store.ids() == [] and list(store.tmp_dir.iterdir()) == []


def test_manifest_rebuilt_when_missing(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    aid = store.put_bytes(DATA)
    m = store.manifest(aid)
    (store.manifests_dir / f"{aid}.json").unlink()
    assert store.manifest(aid) == m


def _chunks(m: Manifest) -> list[bytes]:
    return [DATA[o:o + n] for o, n in (m.chunk_range(i) for i in range(m.chunk_count))]


def test_partial_download_verifies_and_resumes(tmp_path: Path) -> None:
    src = ArtifactStore(tmp_path / "src")
    m = src.manifest(src.put_bytes(DATA))
    dst = ArtifactStore(tmp_path / "dst")
    chunks = _chunks(m)
    with dst.begin_download(m) as part:
        with pytest.raises(IntegrityError):
            part.write_chunk(0, b"x" * len(chunks[0]))
        part.write_chunk(0, chunks[0])
        part.write_chunk(2, chunks[2])
    with dst.begin_download(m) as part:  # resume: only 1 and 3 are missing
        assert part.missing() == [1, 3]
        part.write_chunk(1, chunks[1])
        part.write_chunk(3, chunks[3])
        assert part.finish() == m.artifact_id
    assert dst.path(m.artifact_id).read_bytes() == DATA
    assert list(dst.parts_dir.iterdir()) == []


def test_truncated_part_and_torn_log(tmp_path: Path) -> None:
    src = ArtifactStore(tmp_path / "src")
    m = src.manifest(src.put_bytes(DATA))
    dst = ArtifactStore(tmp_path / "dst")
    chunks = _chunks(m)
    with dst.begin_download(m) as part:
        for i in (0, 1, 2):
            part.write_chunk(i, chunks[i])
        part_path, log_path = part.part_path, part.log_path
    os.truncate(part_path, MiB + 100)  # chunk 2 (and 1's tail) lost on disk
    with open(log_path, "a") as fh:
        fh.write("3")  # a torn, unterminated record must not count
    with dst.begin_download(m) as part:
        assert part.missing() == [1, 2, 3]
        for i in (1, 2, 3):
            part.write_chunk(i, chunks[i])
        assert part.finish() == m.artifact_id
    assert dst.path(m.artifact_id).read_bytes() == DATA


def test_lying_manifest_is_discarded(tmp_path: Path) -> None:
    """Chunks that match a forged manifest still fail the whole-file hash."""
    fake = ArtifactStore(tmp_path / "f").manifest(ArtifactStore(tmp_path / "f").put_bytes(DATA))
    forged = Manifest(artifact_id="1" * 64, size=fake.size, chunk_size=fake.chunk_size,
                      chunks=fake.chunks)
    dst = ArtifactStore(tmp_path / "dst")
    part = dst.begin_download(forged)
    for i, c in enumerate(_chunks(forged)):
        part.write_chunk(i, c)
    with pytest.raises(IntegrityError):
        part.finish()
    assert not dst.has("1" * 64) and list(dst.parts_dir.iterdir()) == []


def test_download_size_limit(tmp_path: Path) -> None:
    m = ArtifactStore(tmp_path / "a").manifest(ArtifactStore(tmp_path / "a").put_bytes(DATA))
    with pytest.raises(ArtifactTooLarge):
        ArtifactStore(tmp_path / "b", max_size=MiB).begin_download(m)


def test_pins_and_gc(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    a, b, c = (store.put_bytes(bytes([i]) * 1000) for i in range(3))
    store.pin(a, "job:1")
    store.pin(b, "job:1")
    store.pin(b, "job:2")
    assert sorted(store.gc()) == [c]
    store.unpin_reason("job:1")
    assert store.pins() == {b: ["job:2"]}
    assert store.gc() == [a]
    store.unpin(b, "job:2")
    assert store.gc() == [b] and store.ids() == []


def test_release_deletes_only_what_the_reason_alone_kept(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    a, b, own = (store.put_bytes(bytes([i]) * 1000) for i in range(3))
    store.pin(a, "job:1")
    store.pin(b, "job:1")
    store.pin(b, "job:2")
    assert store.release("job:1") == [a]
    assert sorted(store.ids()) == sorted([b, own])  # `own` was never pinned: it stays
    assert store.pins() == {b: ["job:2"]}
    assert store.release("job:2") == [b] and store.ids() == [own]
    assert store.release("job:3") == []


def test_gc_partials_by_age_never_open_ones(tmp_path: Path) -> None:
    src = ArtifactStore(tmp_path / "src")
    old_m, open_m, new_m = (src.manifest(src.put_bytes(os.urandom(MiB + i))) for i in range(3))
    store = ArtifactStore(tmp_path / "dst")
    for m in (old_m, new_m):
        part = store.begin_download(m)
        part.write_chunk(0, src.read_range(m.artifact_id, 0, MiB))
        part.close()
    active = store.begin_download(open_m)  # a download in progress
    hour_ago = os.path.getmtime(store.parts_dir) - 3600
    for m in (old_m, open_m):
        for f in store.parts_dir.glob(f"{m.artifact_id}.*"):
            os.utime(f, (hour_ago, hour_ago))
    assert store.gc_partials(max_age_s=600) == [old_m.artifact_id]
    assert store.part_manifest(old_m.artifact_id) is None
    assert store.part_manifest(new_m.artifact_id) is not None
    assert store.part_manifest(open_m.artifact_id) is not None
    active.close()
    assert store.gc_partials(max_age_s=600) == [open_m.artifact_id]


def test_a_claimed_size_never_becomes_a_file_size(tmp_path: Path) -> None:
    """The attack: a provider's manifest claims 60 GiB for a real artifact id.
    Before the fix `begin_download` sized the `.part` file to the claim at once (a
    sparse file of 60 GiB, 0 B on disk, that quotas, `ls` and backups believe). Now
    the file holds what verified chunks reach, and nothing before the first one."""
    claimed = 60 * 1024 * MiB
    chunk = 4 * MiB
    first = os.urandom(chunk)
    n = claimed // chunk
    lie = Manifest(artifact_id=hashlib.sha256(b"real").hexdigest(), size=claimed,
                   chunk_size=chunk, chunks=[hashlib.sha256(first).hexdigest()] * n)
    store = ArtifactStore(tmp_path, max_size=64 * 1024 * MiB)
    with store.begin_download(lie) as part:
        assert os.path.getsize(part.part_path) == 0
        part.write_chunk(0, first)
        part.sync()
        assert os.path.getsize(part.part_path) == chunk
    with store.begin_download(lie) as part:  # a resume does not size it either
        assert os.path.getsize(part.part_path) == chunk and part.missing()[0] == 1


def test_partial_downloads_go_when_they_fail_for_good(tmp_path: Path) -> None:
    """The attack (a cut-off fetch): a 47 MiB partial file was kept for 2 h after its
    job was over. A download pinned for its job now goes with the job's release; an
    explicit discard removes a closed one and never an open one."""
    src = ArtifactStore(tmp_path / "src")
    a_m, b_m = (src.manifest(src.put_bytes(os.urandom(MiB + i))) for i in range(2))
    store = ArtifactStore(tmp_path / "dst")
    for m in (a_m, b_m):
        with store.begin_download(m) as part:
            part.write_chunk(0, src.read_range(m.artifact_id, 0, MiB))
    store.pin(a_m.artifact_id, "job:7")  # the fetch was for job 7 (pinned before it ran)
    assert store.gc_partials(max_age_s=0) == [b_m.artifact_id]  # unpinned: aged out
    assert store.part_manifest(a_m.artifact_id) is not None     # pinned: kept to resume
    assert store.release("job:7") == [a_m.artifact_id]
    assert list(store.parts_dir.iterdir()) == []  # the partial went with the job
    with store.begin_download(a_m) as part:
        assert not store.discard_partial(a_m.artifact_id)  # open: left alone
        part.write_chunk(0, src.read_range(a_m.artifact_id, 0, MiB))
    assert store.discard_partial(a_m.artifact_id)
    assert list(store.parts_dir.iterdir()) == [] and not store.discard_partial(a_m.artifact_id)
