"""A content-addressed, bounded store of results that cannot have changed (docs/cache.md).

An entry is found by a key: the sha256 of the canonical JSON of an *identity*, a
mapping of everything that can change the result (the digests of the programs
and libraries that ran, the model's digest, prompt bytes, arguments,
environment, emulator and machine).  Its value is a set of files (bytes) and a
JSON ``meta``, written by one run (``run_id``) and read back by later ones.

Layout under ``<harness cache>/results/``:

* ``entries/<k2>/<key>/manifest.json``: kind, key, run id, identity, meta, and per
  file its sha256 and size; ``manifest.sha256`` holds the digest of the manifest.
* ``entries/<k2>/<key>/files/<name>``: the files.
* ``digests/``: file digests keyed by path, size, mtime and inode (models are GB).

Concurrency: an entry is written into a temporary directory and renamed into
place under the entry's lock (``filelock``, harness.common.locks.plain); readers take the same lock while
they verify and read, and eviction takes it before deleting, so a reader never
sees half an entry.  Integrity: every read checks the manifest's digest and
every file's size and sha256; an entry that fails is deleted and reported as
``corrupt`` (the caller regenerates it).  Bound: after each write the least
recently used entries (by the manifest's mtime, touched on each hit) are
deleted until the store holds at most ``max_bytes``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common.fs import replace_whole, sha256_file, write_text_whole
from ..common.locks import Rank, plain
from ..common.json_value import JSON

#: Default bound of the store in bytes (2 GiB); ``$HARNESS_RESULT_CACHE_BYTES`` overrides it.  The whole main
#: job on the defaults stores about 3 MiB (measured, docs/cache.md), so this holds the results of several
#: hundred distinct builds.
DEFAULT_MAX_BYTES = 2 << 30
MAX_BYTES_ENV = "HARNESS_RESULT_CACHE_BYTES"

#: What the events of :attr:`ResultCache.stats` count, per kind of entry.
EVENTS = ("hits", "misses", "stored", "corrupt")


def identity_key(identity: Mapping[str, Any]) -> str:
    """The key of ``identity``: hex sha256 of its canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def abstract_paths(value: JSON, paths: Mapping[str, str]) -> JSON:
    """``value`` (JSON: strings, lists, dicts) with each occurrence of a path of ``paths`` replaced by its
    placeholder, longest path first, so a key does not depend on where a checkout or build lives."""
    if isinstance(value, str):
        for prefix in sorted(paths, key=len, reverse=True):
            value = value.replace(prefix, paths[prefix])
        return value
    if isinstance(value, dict):
        return {k: abstract_paths(v, paths) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [abstract_paths(v, paths) for v in value]
    return value


def max_bytes_from_env(environ: Mapping[str, str] | None = None) -> int:
    """The store's bound in bytes: ``$HARNESS_RESULT_CACHE_BYTES`` or :data:`DEFAULT_MAX_BYTES`.

    Raises ValueError naming the variable when it is not a non-negative integer.
    """
    text = (os.environ if environ is None else environ).get(MAX_BYTES_ENV)
    if text is None or text == "":
        return DEFAULT_MAX_BYTES
    try:
        value = int(text)
        if value < 0:
            raise ValueError
    except ValueError:
        raise ValueError(f"{MAX_BYTES_ENV}={text!r}: expected a number of bytes (0 or more)") from None
    return value


@dataclass
class Hit:
    """An entry read back: the ``run_id`` that wrote it, its ``meta``, its files by name (bytes), and ``pending``."""

    key: str
    run_id: str
    meta: dict[str, Any]
    files: dict[str, bytes] = field(default_factory=dict)
    pending: str = ""  # the token of the command that stored it while it is pending (ResultCache.hold)


class ResultCache:
    """The store at ``root`` (see the module docstring), bounded to ``max_bytes``.

    ``read``: False for ``--no-cache``: every lookup misses (and says so), results are still
    stored, replacing the entries they had.  ``stats[kind][event]`` counts :data:`EVENTS`.
    """

    def __init__(self, root: Path, max_bytes: int = DEFAULT_MAX_BYTES, read: bool = True):
        self.root, self.max_bytes, self.read = root, max_bytes, read
        self.entries = root / "entries"
        self.stats: dict[str, dict[str, int]] = {}
        self._hold: str | None = None  # the token of the command whose entries are pending (hold)
        self._pending: list[str] = []

    # ----- pending entries: served to other runs only once their command has ended --------------------------
    def hold(self, token: str) -> None:
        """From now on, entries this process stores are *pending* under ``token`` (a run's command): only this process
        finds them until :meth:`publish`; an interrupted, failed or killed command's are never published or reused."""
        self._hold = token

    def publish(self) -> int:
        """The command ended as it should: its pending entries become entries every run finds; returns how many.
        One that another run replaced meanwhile is left as that run wrote it."""
        return self._settle(keep=True)

    def discard(self) -> int:
        """The command did not end as it should (interrupted, stopped by an error): delete its pending entries;
        returns how many."""
        return self._settle(keep=False)

    def _settle(self, keep: bool) -> int:  # publish (keep) or discard
        done = 0
        for key in self._pending:
            where = self._dir(key)
            with self._lock(key):
                try:
                    manifest = json.loads((where / "manifest.json").read_bytes())
                except (OSError, ValueError):
                    continue
                if manifest.pop("pending", None) == self._hold:
                    self._write_manifest(where, manifest) if keep else shutil.rmtree(where, ignore_errors=True)
                    done += 1
        self._pending.clear()
        return done

    @staticmethod
    def _write_manifest(where: Path, manifest: Mapping[str, Any]) -> None:
        """Write ``manifest`` and its digest into the entry directory ``where``, each file replaced whole."""
        raw = json.dumps(manifest, indent=1, sort_keys=True, default=str).encode()
        replace_whole(where / "manifest.json", lambda tmp: tmp.write_bytes(raw))
        write_text_whole(where / "manifest.sha256", hashlib.sha256(raw).hexdigest() + "\n")

    def _count(self, kind: str, event: str) -> None:
        per = self.stats.setdefault(kind, dict.fromkeys(EVENTS, 0))
        per[event] += 1

    def _dir(self, key: str) -> Path:
        return self.entries / key[:2] / key

    def _lock(self, key: str) -> contextlib.AbstractContextManager[None]:
        path = self.entries / key[:2] / f"{key}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        return plain(path, Rank.CACHE_ENTRY)

    # ----- reading ---------------------------------------------------------------------------------
    def get(self, kind: str, key: str, count_miss: bool = True) -> Hit | None:
        """The entry ``key`` of ``kind``, verified, or None (a miss; a corrupt entry is deleted and counted).

        A hit marks the entry as recently used.  With ``read`` False every call misses.  ``count_miss``:
        False where another lookup for the same result follows a miss (one result, one event).
        """
        where = self._dir(key)
        hit = None
        if self.read and (where / "manifest.json").exists():
            with self._lock(key):
                hit = self._verified(where, kind, key)
                if hit is None:
                    shutil.rmtree(where, ignore_errors=True)
                    self._count(kind, "corrupt")
                elif hit.pending and hit.pending != self._hold:
                    hit = None  # another command's, not ended yet or never to end (interrupted, killed): not served
                else:
                    os.utime(where / "manifest.json")
        if hit is None:
            if count_miss:
                self._count(kind, "misses")
            return None
        self._count(kind, "hits")
        return hit

    @staticmethod
    def _verified(where: Path, kind: str, key: str) -> Hit | None:
        """The entry at ``where`` when its manifest and every file match their digests, else None.  A pending
        entry (:meth:`hold`) is read as it is, its files included, with ``pending`` naming its command."""
        try:
            raw = (where / "manifest.json").read_bytes()
            if hashlib.sha256(raw).hexdigest() != (where / "manifest.sha256").read_text().strip():
                return None
            manifest = json.loads(raw)
            if manifest.get("key") != key or manifest.get("kind") != kind:
                return None
            files = {}
            for name, info in manifest["files"].items():
                data = (where / "files" / name).read_bytes()
                if len(data) != info["bytes"] or hashlib.sha256(data).hexdigest() != info["sha256"]:
                    return None
                files[name] = data
            return Hit(key, str(manifest["run_id"]), dict(manifest.get("meta") or {}), files,
                       str(manifest.get("pending") or ""))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    # ----- writing ---------------------------------------------------------------------------------
    def put(self, kind: str, key: str, run_id: str, identity: Mapping[str, Any], meta: Mapping[str, Any],
            files: Mapping[str, bytes]) -> None:
        """Store ``files`` (name -> bytes; names may hold ``/``) and ``meta`` as entry ``key`` written by ``run_id``.

        ``identity`` (what the key was made of) is kept in the manifest, for people.  An
        existing entry is replaced.  Then the least recently used entries go until the store
        fits ``max_bytes``.  Raises OSError when the cache directory cannot be written.
        """
        final = self._dir(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp-{key}-{os.getpid()}-{time.monotonic_ns()}"
        try:
            listing = {}
            (tmp / "files").mkdir(parents=True)  # also for an entry that is all meta
            for name, data in files.items():
                path = tmp / "files" / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
                listing[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
            self._write_manifest(tmp, {"kind": kind, "key": key, "run_id": run_id, "created": time.time(),
                                       "identity": identity, "meta": meta, "files": listing,
                                       **({"pending": self._hold} if self._hold else {})})
            with self._lock(key):
                shutil.rmtree(final, ignore_errors=True)
                os.replace(tmp, final)
                if self._hold:
                    self._pending.append(key)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self._count(kind, "stored")
        self.evict()

    def size(self) -> int:
        """Bytes the entries' files and manifests hold."""
        return sum(size for _, _, size in self._listing())

    def _listing(self) -> list[tuple[float, str, int]]:
        out = []
        for manifest in self.entries.glob("*/*/manifest.json"):
            try:
                mtime = manifest.stat().st_mtime
                size = sum(p.stat().st_size for p in manifest.parent.rglob("*") if p.is_file())
            except OSError:  # deleted meanwhile by another process
                continue
            out.append((mtime, manifest.parent.name, size))
        return out

    def evict(self) -> list[str]:
        """Delete least recently used entries until the store holds at most ``max_bytes``; returns their keys."""
        gone = []
        with plain(self.root / "evict.lock", Rank.CACHE_EVICT):
            listing = sorted(self._listing())
            total = sum(size for _, _, size in listing)
            for _, key, size in listing:
                if total <= self.max_bytes:
                    break
                with self._lock(key):
                    shutil.rmtree(self._dir(key), ignore_errors=True)
                total -= size
                gone.append(key)
        return gone


# --------------------------------------------------------------------------- digests of what ran

class DigestMemo:
    """sha256 of large files (models), remembered under ``root`` by path, size, mtime and inode, as make and
    ccache's direct mode trust them: a file rewritten keeps none of the three equal in practice."""

    def __init__(self, root: Path):
        self.root = root
        self._mem: dict[tuple, str] = {}

    def digest(self, path: Path) -> str:
        """Hex sha256 of the file at ``path`` (raises OSError when it cannot be read)."""
        path = path.resolve()
        st = path.stat()
        stamp = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
        if stamp in self._mem:
            return self._mem[stamp]
        memo = self.root / f"{hashlib.sha256(str(path).encode()).hexdigest()[:32]}.json"
        try:
            saved = json.loads(memo.read_text())
            if tuple(saved["stamp"]) == stamp:
                self._mem[stamp] = saved["sha256"]
                return saved["sha256"]
        except (OSError, ValueError, KeyError, TypeError):
            pass
        value = sha256_file(path)
        self._mem[stamp] = value
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo.with_name(f"{memo.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"stamp": list(stamp), "sha256": value}))
            os.replace(tmp, memo)
        except OSError:
            pass
        return value


def _elf_build_id(data: bytes) -> tuple[int, int] | None:
    """(offset, length) of the GNU build-id bytes of an ELF image, or None (pyelftools reads the notes)."""
    import io

    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    try:
        elf = ELFFile(io.BytesIO(data))
        section = elf.get_section_by_name(".note.gnu.build-id")
        if section is None:
            return None
        for note in section.iter_notes():  # type: ignore[attr-defined]  # a SHT_NOTE section: pyelftools' NoteSection
            if note["n_type"] == "NT_GNU_BUILD_ID":
                # the descriptor follows the 12-byte header and the name, padded to 4 bytes
                start = note["n_offset"] + 12 + ((note["n_namesz"] + 3) & ~3)
                return start, note["n_descsz"]
    except (ELFError, ValueError, KeyError):
        return None
    return None


def _pe_stamps(data: bytes) -> list[tuple[int, int]]:
    """(offset, length) of the link time stamps and the checksum of a PE image (pefile reads the headers)."""
    import pefile
    try:
        pe = pefile.PE(data=data, fast_load=True)
    except pefile.PEFormatError:
        return []
    spans = [(pe.FILE_HEADER.get_field_absolute_offset("TimeDateStamp"), 4),
             (pe.OPTIONAL_HEADER.get_field_absolute_offset("CheckSum"), 4)]
    pe.parse_data_directories(directories=[pefile.DIRECTORY_ENTRY["IMAGE_DIRECTORY_ENTRY_DEBUG"],
                                           pefile.DIRECTORY_ENTRY["IMAGE_DIRECTORY_ENTRY_EXPORT"]])
    for entry in getattr(pe, "DIRECTORY_ENTRY_DEBUG", []):
        spans.append((entry.struct.get_field_absolute_offset("TimeDateStamp"), 4))
    export = getattr(pe, "DIRECTORY_ENTRY_EXPORT", None)
    if export is not None:
        spans.append((export.struct.get_field_absolute_offset("TimeDateStamp"), 4))
    return spans


def normalized_image(data: bytes, labels: Iterable[bytes] = ()) -> bytes:
    """The bytes of a program or library with what names the build rather than its code zeroed.

    Zeroed: each NUL-terminated occurrence of ``labels`` (the build-info strings naming the
    series and its commit, harness.stages.building.binaries.build_labels), the GNU build-id of
    an ELF image (a hash the linker computes over the image, so it follows the label), and a PE
    image's link time stamps and checksum (MinGW's ld writes the link time).  Every other byte
    is kept, so any change to code or data changes the digest.
    """
    out = bytearray(data)
    spans: list[tuple[int, int]] = []
    if data[:4] == b"\x7fELF":
        found = _elf_build_id(data)
        spans += [found] if found else []
    elif data[:2] == b"MZ":
        spans += _pe_stamps(data)
    for start, length in spans:
        out[start:start + length] = bytes(length)
    for label in labels:
        if not label:
            continue
        needle = label + b"\0"
        at = out.find(needle)
        while at != -1:
            out[at:at + len(needle)] = bytes(len(needle))
            at = out.find(needle, at + len(needle))
    return bytes(out)


_IMAGE_MEMO: dict[tuple, str] = {}


def image_digest(path: Path, labels: Sequence[bytes] = ()) -> str:
    """Hex sha256 of :func:`normalized_image` of the file at ``path`` (remembered per path, size, mtime,
    inode and labels within the process; raises OSError when it cannot be read)."""
    st = path.stat()
    stamp = (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ino, tuple(labels))
    if stamp not in _IMAGE_MEMO:
        _IMAGE_MEMO[stamp] = hashlib.sha256(normalized_image(path.read_bytes(), labels)).hexdigest()
    return _IMAGE_MEMO[stamp]


def images_digest(paths: Iterable[Path], labels: Sequence[bytes] = ()) -> dict[str, str]:
    """File name -> :func:`image_digest` for ``paths`` (symbolic links followed, each real file once)."""
    out = {}
    for path in sorted({p.resolve() for p in paths}):
        out[path.name] = image_digest(path, labels)
    return out
