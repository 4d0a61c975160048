"""On-disk compile cache keyed by content hash.

Each entry is two files under ``<dir>/<key[:2]>/``: ``<key>.cubin`` (only for successful
compiles) and ``<key>.json`` (status, log, diagnostics and the cubin's sha256). The JSON is
written last, so it marks a complete entry; both are written to a temp file and renamed into
place, so a reader never sees half a file. Failed compiles are cached too (a bad candidate is
not compiled twice); timeouts and crashes are not (they say nothing reliable about the source).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterable

from .diagnostics import CompileResult, Diagnostic

log = logging.getLogger(__name__)

# Bump when the entry layout or anything that feeds the key changes meaning.
CACHE_FORMAT = "cuda-agent/compile-cache@1"
DEFAULT_MAX_BYTES = 2 * 1024**3
# Pruning goes down to this fraction of the cap, so it does not run on every put.
_PRUNE_TO = 0.8
CACHEABLE_STATUSES = ("ok", "error")


def default_cache_dir() -> Path:
    """`compile` under the one cache root of every cuda-agent cache (env CUDA_AGENT_CACHE, default
    ~/.cache/cuda-agent; baselines and ceilings live beside it: core.evaluation.roofline.cache_root)."""
    root = os.environ.get("CUDA_AGENT_CACHE")
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "cuda-agent") / "compile"


def compile_key(source: str, options: Iterable[str], arch: str, nvrtc_version: str | None,
                filename: str = "kernel.cu", extra: str = "") -> str:
    """sha256 over everything that decides the compile's output. Options keep their order:
    a later -D overrides an earlier one, so order changes meaning."""
    payload = json.dumps([CACHE_FORMAT, source, list(options), arch, nvrtc_version or "", filename, extra],
                         ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class CompileCache:
    """Thread-safe within a process; safe across processes because entries are immutable and
    renamed into place (two writers of one key write the same content)."""

    def __init__(self, directory: str | os.PathLike | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
        self.directory = Path(directory).expanduser() if directory is not None else default_cache_dir()
        self.max_bytes = int(max_bytes)
        self._lock = threading.Lock()
        self._size_estimate: int | None = None   # bytes on disk, scanned lazily on the first put

    def __repr__(self) -> str:
        return f"CompileCache({str(self.directory)!r}, max_bytes={self.max_bytes})"

    # -- paths -------------------------------------------------------------------------------
    def _paths(self, key: str) -> tuple[Path, Path]:
        folder = self.directory / key[:2]
        return folder / f"{key}.json", folder / f"{key}.cubin"

    # -- read --------------------------------------------------------------------------------
    def get(self, key: str) -> CompileResult | None:
        """The cached result (cached=True, seconds = lookup time), or None when absent or corrupt.
        A corrupt entry is deleted, so the next put rewrites it."""
        if not key:
            return None
        start = time.perf_counter()
        meta_path, cubin_path = self._paths(key)
        try:
            raw = meta_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError:
            return None
        try:
            meta = json.loads(raw.decode("utf-8"))
            if meta.get("format") != CACHE_FORMAT or meta.get("key") != key:
                raise ValueError("format or key mismatch")
            status = meta["status"]
            if status not in CACHEABLE_STATUSES:
                raise ValueError(f"uncacheable status {status!r}")
            cubin = None
            if meta["ok"]:
                cubin = cubin_path.read_bytes()
                if len(cubin) != meta["cubin_size"] or hashlib.sha256(cubin).hexdigest() != meta["cubin_sha256"]:
                    raise ValueError("cubin does not match its checksum")
            diagnostics = [Diagnostic(d["severity"], d["line"], d["column"], d["message"], d["source_line"])
                           for d in meta["diagnostics"]]
            result = CompileResult(ok=bool(meta["ok"]), status=status, cubin=cubin, log=str(meta["log"]),
                                   diagnostics=diagnostics, seconds=0.0, cached=True, key=key,
                                   arch=str(meta["arch"]))
        except (ValueError, KeyError, TypeError, OSError, UnicodeDecodeError) as exc:
            log.warning("ignoring corrupt compile cache entry %s (%s)", meta_path, exc)
            self._remove(key)
            return None
        try:
            os.utime(meta_path)    # mark as recently used for LRU pruning
        except OSError:
            pass
        result.seconds = time.perf_counter() - start
        return result

    def __contains__(self, key: str) -> bool:
        return self._paths(key)[0].exists()

    # -- write -------------------------------------------------------------------------------
    def put(self, result: CompileResult) -> bool:
        """Store a result; returns False for uncacheable ones (timeout, crash, no key) or when the
        cache directory cannot be written (a cache problem must never fail a compile)."""
        if result.status not in CACHEABLE_STATUSES or not result.key:
            return False
        if result.ok and not result.cubin:
            return False
        meta_path, cubin_path = self._paths(result.key)
        cubin = result.cubin if result.ok else None
        meta = {
            "format": CACHE_FORMAT,
            "key": result.key,
            "ok": result.ok,
            "status": result.status,
            "arch": result.arch,
            "log": result.log,
            "compile_seconds": result.seconds,
            "diagnostics": [{"severity": d.severity, "line": d.line, "column": d.column,
                             "message": d.message, "source_line": d.source_line} for d in result.diagnostics],
            "cubin_size": len(cubin) if cubin else 0,
            "cubin_sha256": hashlib.sha256(cubin).hexdigest() if cubin else None,
        }
        data = json.dumps(meta, ensure_ascii=False).encode("utf-8")
        try:
            if cubin:
                _atomic_write(cubin_path, cubin)
            _atomic_write(meta_path, data)
        except OSError as exc:
            log.warning("could not write compile cache entry under %s: %s", self.directory, exc)
            return False
        self._account(len(data) + (len(cubin) if cubin else 0))
        return True

    def _remove(self, key: str) -> None:
        for path in self._paths(key):
            try:
                path.unlink()
            except OSError:
                pass

    # -- size cap ----------------------------------------------------------------------------
    def _entries(self) -> list[tuple[float, int, str]]:
        """(last use, bytes, key) for every complete entry."""
        entries = []
        if not self.directory.is_dir():
            return entries
        for meta_path in self.directory.glob("??/*.json"):
            key = meta_path.stem
            try:
                st = meta_path.stat()
                size = st.st_size
                cubin_path = meta_path.with_suffix(".cubin")
                if cubin_path.exists():
                    size += cubin_path.stat().st_size
            except OSError:
                continue
            entries.append((st.st_mtime, size, key))
        return entries

    def size_bytes(self) -> int:
        return sum(size for _, size, _ in self._entries())

    def _account(self, added: int) -> None:
        with self._lock:
            if self._size_estimate is None:
                self._size_estimate = self.size_bytes()
            else:
                self._size_estimate += added
            over = self._size_estimate > self.max_bytes
        if over:
            self.prune()

    def prune(self, target_bytes: int | None = None) -> int:
        """Delete least recently used entries until the cache holds at most target_bytes
        (default 80% of max_bytes). Returns the number of entries removed."""
        target = int(self.max_bytes * _PRUNE_TO) if target_bytes is None else int(target_bytes)
        with self._lock:
            entries = sorted(self._entries())
            total = sum(size for _, size, _ in entries)
            removed = 0
            for _, size, key in entries:
                if total <= target:
                    break
                self._remove(key)
                total -= size
                removed += 1
            self._size_estimate = total
        return removed

    def clear(self) -> None:
        for _, _, key in self._entries():
            self._remove(key)
        with self._lock:
            self._size_estimate = 0
