"""The project file: one SQLite database (.cuagent) that keeps everything a run measured.

    project = Project.create("gelu.cuagent", task, hardware=gpu_info)
    project.run_started()                       # WAL while the run is live
    cid = project.add_candidate(record)         # committed before this returns
    project.record_result(cid, result, reward)  # committed before the next proposal
    project.run_stopped()
    project.close()

Opening checks the file before anything can write to it (all checks run on a read-only
connection) and refuses damaged, foreign and newer files with a ProjectError that names the
file. Layout, versions and guarantees: docs/project-file.md.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
import socket
import sqlite3
import threading
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

from .migrations import APPLICATION_ID, CURRENT_DDL, CURRENT_VERSION, steps_from
from .records import (KINDS, PENDING_STATUSES, STATUSES, Branch, CandidateRecord, CandidateSummary, PolicyCheckpoint,
                      RunSession, now_iso)

SQLITE_MAGIC = b"SQLite format 3\x00"
# Files up to this size get a full quick_check on open (a fraction of a second even when cold).
# Bigger ones check every table except the three that grow with the run, so that opening a
# 50,000-candidate project stays instant; verify() checks everything.
FULL_CHECK_MAX_BYTES = 32 << 20
GROWING_TABLES = ("candidates", "sources", "checkpoints")
BUSY_TIMEOUT_S = 10.0
PAGE = 500   # rows per query when iterating candidates, so no read stays open between pages

_CANDIDATE_COLUMNS = ("c.id, c.branch_id, c.parent_id, c.origin, c.kind, c.program, c.schedule, "
                      "c.candidate_hash, c.status, c.reason, c.measurement, c.reward, c.created_at, "
                      "c.evaluated_at, c.extra, s.text")
_CANDIDATE_FROM = "candidates c LEFT JOIN sources s ON s.hash = c.source_hash"
_RUN_COLUMNS = "id, started_at, stopped_at, clean, pid, host, resumed_from, meta"


class ProjectError(Exception):
    """A project file cannot be created, opened or written; the message names the file."""


class _HotJournal(Exception):
    """A rollback journal left by a writer that died mid-transaction (only a writer can undo it)."""


# ---- small helpers --------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_plain, ensure_ascii=False, separators=(",", ":"))


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _status_text(status: Any) -> str:
    text = str(getattr(status, "value", status))
    if text not in STATUSES:
        raise ValueError(f"unknown candidate status {text!r}; expected one of {', '.join(STATUSES)}")
    return text


def _measurement_dict(measurement: Any) -> dict[str, Any] | None:
    if measurement is None or isinstance(measurement, dict):
        return measurement
    return _plain(measurement)   # a Measurement dataclass


def _median(measurement: dict[str, Any] | None) -> float | None:
    timing = (measurement or {}).get("timing") or {}
    value = timing.get("median_ms")
    return float(value) if isinstance(value, (int, float)) else None


def _uri(path: Path, mode: str) -> str:
    return f"{path.resolve().as_uri()}?mode={mode}"


def _connect(path: Path, mode: str) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN/COMMIT ourselves, so nothing commits behind our back.
    db = sqlite3.connect(_uri(path, mode), uri=True, isolation_level=None, check_same_thread=False,
                         timeout=BUSY_TIMEOUT_S)
    return db


def _app_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("cuda-agent")
    except metadata.PackageNotFoundError:
        return "source checkout"


# ---- checks that run before a file is opened -------------------------------------------------------


def _not_modified(path: Path, problem: str) -> ProjectError:
    return ProjectError(f"{path} {problem} It was not modified.")


def _check_header(path: Path) -> None:
    """File-level checks from the 100-byte SQLite header: no SQLite involved, nothing written."""
    if not path.exists():
        raise ProjectError(f"{path}: there is no such file.")
    if not path.is_file():
        raise ProjectError(f"{path} is not a file (a folder?); a project is one .cuagent file.")
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            header = f.read(100)
    except OSError as exc:
        raise ProjectError(f"{path} cannot be read: {exc.strerror or exc}.") from None
    if size == 0:
        raise _not_modified(path, "is empty: it is not a CUDA Agent project (not an SQLite database).")
    if not header.startswith(SQLITE_MAGIC):
        raise _not_modified(path, "is not a CUDA Agent project (not an SQLite database): a project file "
                                  "starts with the SQLite header, this one does not.")
    if len(header) < 100:
        raise _not_modified(path, f"is damaged: it ends after {size} bytes, inside the SQLite header.")
    app_id = int.from_bytes(header[68:72], "big")
    if app_id != APPLICATION_ID:
        raise _not_modified(path, f"is a foreign SQLite file, not a CUDA Agent project (its application id is "
                                  f"{app_id:#x}, a project's is {APPLICATION_ID:#x}).")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    size_valid = header[92:96] == header[24:28]   # SQLite's rule for trusting the in-header size
    wal = Path(f"{path}-wal")
    wal_pending = wal.exists() and wal.stat().st_size > 0   # then the WAL, not the file, is authoritative
    if size_valid and not wal_pending and size < pages * page_size:
        raise _not_modified(path, f"is damaged: it is truncated ({size} bytes where the database has "
                                  f"{pages * page_size}). Restore it from a copy or a .bak file.")


def _check_database(path: Path, db: sqlite3.Connection) -> int:
    """SQLite-level checks on a read-only connection; returns the schema version."""
    try:
        app_id = db.execute("PRAGMA application_id").fetchone()[0]
        version = db.execute("PRAGMA user_version").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        if getattr(exc, "sqlite_errorcode", None) == 776:   # SQLITE_READONLY_ROLLBACK
            raise _HotJournal() from None
        raise _not_modified(path, f"is damaged: SQLite cannot read it ({exc}).") from None
    if app_id != APPLICATION_ID:
        raise _not_modified(path, f"is a foreign SQLite file, not a CUDA Agent project (application id {app_id:#x}).")
    if version > CURRENT_VERSION:
        raise _not_modified(path, f"was written by a newer CUDA Agent (schema {version}, this version reads up "
                                  f"to {CURRENT_VERSION}); update CUDA Agent to open it.")
    if version < 1:
        raise _not_modified(path, "has no schema version: it is damaged or was never finished being created.")
    try:
        if path.stat().st_size <= FULL_CHECK_MAX_BYTES:
            problems = [r[0] for r in db.execute("PRAGMA quick_check").fetchall()]
        else:
            tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            problems = []
            for table in ["sqlite_master"] + [t for t in tables if t not in GROWING_TABLES]:
                problems += [r[0] for r in db.execute(f"PRAGMA quick_check('{table}')").fetchall()]
    except sqlite3.DatabaseError as exc:
        raise _not_modified(path, f"is damaged: SQLite cannot read it ({exc}).") from None
    problems = [" ".join(p.split()) for p in problems if p != "ok"]
    if problems:
        listed = "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")
        raise _not_modified(path, f"is damaged: SQLite's check found {listed}.")
    return version


def _backup_path(path: Path, version: int) -> Path:
    """NAME.cuagent.bak-v1, or -2, -3... when that exists: a backup is never overwritten."""
    candidate = Path(f"{path}.bak-v{version}")
    n = 2
    while candidate.exists():
        candidate = Path(f"{path}.bak-v{version}-{n}")
        n += 1
    return candidate


def _migrate(db: sqlite3.Connection, version: int, where: str) -> None:
    """Apply every step above `version`, each in its own transaction with its version bump."""
    for target, step in steps_from(version):
        try:
            db.execute("BEGIN IMMEDIATE")
            step(db)
            db.execute(f"PRAGMA user_version = {int(target)}")
            db.execute("COMMIT")
        except Exception as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise ProjectError(f"{where}: upgrading from schema {target - 1} to {target} failed ({exc}); "
                               f"the file was left at schema {target - 1}.") from None


# ---- the project ----------------------------------------------------------------------------------


class Project:
    """An open project file. Thread-safe; create with Project.create or Project.open."""

    def __init__(self, path: Path, db: sqlite3.Connection, readonly: bool, migrated_from: int | None = None):
        self.path = path
        self.readonly = readonly
        self.migrated_from = migrated_from   # schema the file had before this open upgraded it
        self.backup_path: Path | None = None
        self._db = db
        self._lock = threading.RLock()
        self._run_id: int | None = None
        self._meta = {k: _loads(v) for k, v in self._query("SELECT key, value FROM meta")}

    # ---- creating and opening --------------------------------------------------------------------

    @classmethod
    def create(cls, path: str | Path, task: Any, hardware: dict[str, Any] | None = None) -> "Project":
        """A new project for `task` (name, source, hash). Never replaces an existing file."""
        path = Path(path)
        if path.exists() or path.is_symlink():
            raise ProjectError(f"{path} already exists; a new project never replaces a file. "
                               "Open it, or choose another name.")
        if not path.parent.is_dir():
            raise ProjectError(f"{path}: the folder {path.parent} does not exist.")
        # Build the file under a temporary name, then link it into place: a crash leaves no
        # half-made project, and the link fails if someone created the name meanwhile.
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            db = sqlite3.connect(str(tmp), isolation_level=None)
            try:
                db.executescript(f"BEGIN;{CURRENT_DDL}COMMIT;")
                db.execute("BEGIN")
                meta = {"task_name": task.name, "task_source": task.source, "task_hash": task.hash,
                        "hardware": hardware, "created_at": now_iso(), "created_with": _app_version()}
                db.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", [(k, _dumps(v)) for k, v in meta.items()])
                db.execute("INSERT INTO branches (id, name, created_at) VALUES (1, 'main', ?)", (now_iso(),))
                db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                db.execute(f"PRAGMA user_version = {CURRENT_VERSION}")
                db.execute("COMMIT")
            finally:
                db.close()
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise ProjectError(f"{path} already exists; a new project never replaces a file.") from None
            except OSError:   # a file system without hard links
                if path.exists():
                    raise ProjectError(f"{path} already exists; a new project never replaces a file.") from None
                os.rename(tmp, path)
        except sqlite3.Error as exc:
            raise ProjectError(f"{path}: the project could not be created ({exc}).") from None
        except OSError as exc:
            raise ProjectError(f"{path}: the project could not be created ({exc.strerror or exc}).") from None
        finally:
            for leftover in (tmp, Path(f"{tmp}-journal")):
                leftover.unlink(missing_ok=True)
        return cls.open(path)

    @classmethod
    def open(cls, path: str | Path, readonly: bool = False) -> "Project":
        """Open a project after checking it; an older schema is upgraded (a backup is kept first).

        readonly=True never writes, also while another process runs on the file; an older file
        is then upgraded in a private in-memory copy only.
        """
        path = Path(path)
        _check_header(path)
        try:
            ro = _connect(path, "ro")
            handed_over = False   # the read-only connection becomes a read-only project's own
            try:
                try:
                    version = _check_database(path, ro)
                except _HotJournal:
                    ro.close()
                    if readonly:
                        raise ProjectError(
                            f"{path} was left in the middle of a write by a process that stopped; open it once "
                            "for writing (not read-only) so that SQLite can undo the unfinished write. It was "
                            "not modified.") from None
                    cls._roll_back_hot_journal(path)
                    ro = _connect(path, "ro")
                    version = _check_database(path, ro)
                if readonly:
                    handed_over = True
                    return cls._open_readonly(path, ro, version)
                backup = cls._backup(path, ro, version) if version < CURRENT_VERSION else None
            finally:
                if not handed_over:
                    ro.close()
            return cls._open_for_writing(path, version, backup)
        except sqlite3.Error as exc:
            raise ProjectError(f"{path} cannot be opened: {exc}.") from None

    @classmethod
    def _open_readonly(cls, path: Path, ro: sqlite3.Connection, version: int) -> "Project":
        db = ro
        try:
            if version < CURRENT_VERSION:
                db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
                ro.backup(db)
                ro.close()
                _migrate(db, version, str(path))
            db.execute("PRAGMA query_only = ON")
            return cls(path, db, readonly=True, migrated_from=version if version < CURRENT_VERSION else None)
        except BaseException:
            db.close()
            ro.close()
            raise

    @staticmethod
    def _backup(path: Path, ro: sqlite3.Connection, version: int) -> Path:
        """Copy the file before upgrading it (SQLite's backup: consistent, WAL content included)."""
        backup = _backup_path(path, version)
        dest = sqlite3.connect(str(backup))
        try:
            ro.backup(dest)
        finally:
            dest.close()
        return backup

    @classmethod
    def _open_for_writing(cls, path: Path, version: int, backup: Path | None) -> "Project":
        db = _connect(path, "rw")
        try:
            db.execute("PRAGMA foreign_keys = ON")
            db.execute("PRAGMA synchronous = FULL")   # a commit survives power loss, not just a kill
            if backup is not None:
                try:
                    _migrate(db, version, str(path))
                except ProjectError as exc:
                    raise ProjectError(f"{exc} The original is also kept at {backup}.") from None
            project = cls(path, db, readonly=False, migrated_from=version if backup else None)
        except BaseException:
            db.close()
            raise
        project.backup_path = backup
        return project

    @staticmethod
    def _roll_back_hot_journal(path: Path) -> None:
        # The header already says this is our file; SQLite undoes the dead writer's
        # unfinished transaction on the first read of a writable connection.
        db = _connect(path, "rw")
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            db.close()

    def close(self) -> None:
        """Close the file; a run still live is recorded as stopped, not cleanly."""
        with self._lock:
            if self._db is None:
                return
            try:
                if self._run_id is not None:
                    self.run_stopped(clean=False)
            finally:
                self._db.close()
                self._db = None

    def __enter__(self) -> "Project":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Project({str(self.path)!r}, readonly={self.readonly})"

    # ---- low level ---------------------------------------------------------------------------------

    def _error(self, exc: sqlite3.Error, doing: str) -> ProjectError:
        text = str(exc)
        if isinstance(exc, sqlite3.IntegrityError):
            return ProjectError(f"{self.path}: {doing} was refused by the file's constraints ({text}).")
        if "locked" in text or "busy" in text:
            return ProjectError(f"{self.path}: {doing} failed: another process held the file for more than "
                                f"{BUSY_TIMEOUT_S:.0f} s ({text}).")
        if isinstance(exc, sqlite3.DatabaseError) and ("malformed" in text or "not a database" in text):
            return ProjectError(f"{self.path} is damaged: {doing} failed ({text}). Restore it from a copy "
                                "or a .bak file.")
        return ProjectError(f"{self.path}: {doing} failed ({text}).")

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[tuple]:
        with self._lock:
            if self._db is None:
                raise ProjectError(f"{self.path} is closed.")
            try:
                return self._db.execute(sql, tuple(params)).fetchall()
            except sqlite3.Error as exc:
                raise self._error(exc, "reading") from None

    @contextmanager
    def _write(self, doing: str) -> Iterator[sqlite3.Connection]:
        """One transaction, committed (durably) when the block ends."""
        if self.readonly:
            raise ProjectError(f"{self.path} is open read-only; {doing} needs it open for writing.")
        with self._lock:
            if self._db is None:
                raise ProjectError(f"{self.path} is closed.")
            db = self._db
            try:
                db.execute("BEGIN IMMEDIATE")
                yield db
                db.execute("COMMIT")
            except sqlite3.Error as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise self._error(exc, doing) from None
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    def _set_meta(self, key: str, value: Any) -> None:
        with self._write(f"saving {key}") as db:
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, _dumps(value)))
        self._meta[key] = value

    @property
    def schema_version(self) -> int:
        return self._query("PRAGMA user_version")[0][0]

    @property
    def journal_mode(self) -> str:
        return self._query("PRAGMA journal_mode")[0][0]

    def compact(self) -> int:
        """Drop checkpoints beyond the newest KEEP_CHECKPOINTS per policy (files written before that
        rule) and give the free pages back to the file system; returns the bytes saved."""
        before = self.path.stat().st_size
        with self._write("dropping old checkpoints") as db:
            db.execute("DELETE FROM checkpoints WHERE id NOT IN (SELECT id FROM (SELECT id, ROW_NUMBER() OVER "
                       "(PARTITION BY policy ORDER BY id DESC) AS age FROM checkpoints) WHERE age <= ?)",
                       (self.KEEP_CHECKPOINTS,))
        with self._lock:
            if self._db is None:
                raise ProjectError(f"{self.path} is closed.")
            self._db.execute("VACUUM")
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return before - self.path.stat().st_size

    def verify(self) -> list[str]:
        """Full integrity check of every page (reads the whole file); [] when all is well."""
        try:
            rows = [r[0] for r in self._query("PRAGMA integrity_check")]
        except ProjectError as exc:   # damage bad enough that the check itself stops
            return [str(exc)]
        return [] if rows == ["ok"] else rows

    # ---- task and hardware -------------------------------------------------------------------------

    @property
    def task_name(self) -> str:
        return self._meta["task_name"]

    @property
    def task_source(self) -> str:
        return self._meta["task_source"]

    @property
    def task_hash(self) -> str:
        return self._meta["task_hash"]

    @property
    def created_at(self) -> str:
        return self._meta.get("created_at", "")

    @property
    def hardware(self) -> dict[str, Any] | None:
        return self._meta.get("hardware")

    def set_hardware(self, hardware: dict[str, Any] | None) -> None:
        self._set_meta("hardware", hardware)

    def load_task(self) -> Any:
        """The stored reference as a core.tasks.Task (imports torch)."""
        from core.tasks import load_task_from_source

        return load_task_from_source(self.task_source, self.task_name)

    # ---- baselines, one per GPU model (gpu_key) ----------------------------------------------------

    def set_baselines(self, gpu_key: str, baselines: Any) -> None:
        """Store a core.evaluation.Baselines (or its to_json() text) for one GPU model."""
        text = baselines if isinstance(baselines, str) else baselines.to_json()
        with self._write("saving baselines") as db:
            db.execute("INSERT OR REPLACE INTO baselines (gpu_key, json, updated_at) VALUES (?, ?, ?)",
                       (gpu_key, text, now_iso()))

    def baselines_json(self, gpu_key: str) -> str | None:
        rows = self._query("SELECT json FROM baselines WHERE gpu_key = ?", (gpu_key,))
        return rows[0][0] if rows else None

    def baselines(self, gpu_key: str) -> Any:
        """The Baselines for this GPU model, or None (never measured, or an older format that
        must be measured again; its text stays in the file, see baselines_json)."""
        from core.evaluation.evaluator import Baselines

        text = self.baselines_json(gpu_key)
        if text is None:
            return None
        try:
            return Baselines.from_json(text)
        except (ValueError, TypeError):
            return None

    def baseline_keys(self) -> list[str]:
        return [r[0] for r in self._query("SELECT gpu_key FROM baselines ORDER BY gpu_key")]

    # ---- branches ----------------------------------------------------------------------------------

    def add_branch(self, name: str, parent_candidate_id: int | None = None) -> Branch:
        name = name.strip()
        if not name:
            raise ValueError("a branch needs a name")
        if self.branch(name) is not None:
            raise ProjectError(f"{self.path} already has a branch named '{name}'.")
        created = now_iso()
        with self._write(f"adding branch '{name}'") as db:
            cur = db.execute("INSERT INTO branches (name, parent_candidate_id, created_at) VALUES (?, ?, ?)",
                             (name, parent_candidate_id, created))
        return Branch(cur.lastrowid, name, parent_candidate_id, created)

    def branches(self) -> list[Branch]:
        return [Branch(*r) for r in self._query(
            "SELECT id, name, parent_candidate_id, created_at FROM branches ORDER BY id")]

    def branch(self, key: int | str) -> Branch | None:
        """A branch by id or by name."""
        column = "id" if isinstance(key, int) else "name"
        rows = self._query(f"SELECT id, name, parent_candidate_id, created_at FROM branches WHERE {column} = ?",
                           (key,))
        return Branch(*rows[0]) if rows else None

    # ---- candidates --------------------------------------------------------------------------------

    def _source_ref(self, db: sqlite3.Connection, text: str | None) -> str | None:
        """Store a source text once (many candidates share one) and return its hash."""
        if text is None:
            return None
        digest = _sha256(text)
        db.execute("INSERT OR IGNORE INTO sources (hash, text) VALUES (?, ?)", (digest, text))
        return digest

    def _candidate_row(self, db: sqlite3.Connection, rec: CandidateRecord) -> tuple:
        if rec.kind not in KINDS:
            raise ValueError(f"unknown candidate kind {rec.kind!r}; expected one of {', '.join(KINDS)}")
        if rec.kind == "program" and rec.program is None:
            raise ValueError("a candidate of kind 'program' needs its program (KernelProgram.to_dict())")
        if rec.kind == "modelnew" and rec.solution_source is None:
            raise ValueError("a candidate of kind 'modelnew' needs its solution_source")
        rec.created_at = rec.created_at or now_iso()
        program_json, source_hash = self._program_columns(db, rec.kind, rec.program, rec.solution_source)
        measurement = _measurement_dict(rec.measurement)
        return (rec.branch_id, rec.parent_id, rec.origin, rec.kind, program_json, source_hash,
                _dumps(rec.schedule or {}), rec.candidate_hash, _status_text(rec.status), rec.reason or "",
                None if measurement is None else _dumps(measurement), _median(measurement), rec.reward,
                rec.created_at, rec.evaluated_at, _dumps(rec.extra or {}))

    def _program_columns(self, db: sqlite3.Connection, kind: str, program: dict[str, Any] | None,
                         solution_source: str | None) -> tuple[str | None, str | None]:
        if kind == "modelnew":
            return None, self._source_ref(db, solution_source)
        stored = dict(program)
        source = stored.get("source")
        if isinstance(source, str):
            stored["source"] = None   # the text lives in `sources`, named by source_hash
        return _dumps(stored), self._source_ref(db, source if isinstance(source, str) else None)

    _INSERT = ("INSERT INTO candidates (branch_id, parent_id, origin, kind, program, source_hash, schedule, "
               "candidate_hash, status, reason, measurement, median_ms, reward, created_at, evaluated_at, extra) "
               "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")

    def add_candidate(self, rec: CandidateRecord) -> int:
        """Insert and commit one candidate; sets rec.id (and created_at if empty), returns the id."""
        with self._write("adding a candidate") as db:
            candidate_id = db.execute(self._INSERT, self._candidate_row(db, rec)).lastrowid
        rec.id = candidate_id
        return candidate_id

    def add_candidates(self, records: Iterable[CandidateRecord]) -> list[int]:
        """Insert many candidates in one transaction (imports, replays); sets each rec.id."""
        records = list(records)
        with self._write("adding candidates") as db:
            ids = [db.execute(self._INSERT, self._candidate_row(db, rec)).lastrowid for rec in records]
        for rec, candidate_id in zip(records, ids):
            rec.id = candidate_id
        return ids

    # What evaluation fills in. The code, hash, lineage and origin of a candidate never change:
    # a changed kernel is a new candidate.
    UPDATABLE = ("status", "reason", "measurement", "reward", "evaluated_at", "extra")

    def update_candidate(self, candidate_id: int, **fields: Any) -> None:
        """Change evaluation fields (UPDATABLE) and commit. A final status stamps evaluated_at if not given."""
        refused = set(fields) - set(self.UPDATABLE)
        if refused:
            raise ValueError(f"cannot update {', '.join(sorted(refused))} of a candidate; "
                             f"updatable: {', '.join(self.UPDATABLE)}")
        if "status" in fields:
            fields["status"] = _status_text(fields["status"])
            if fields["status"] not in PENDING_STATUSES:
                fields.setdefault("evaluated_at", now_iso())
        columns: dict[str, Any] = {}
        for name, value in fields.items():
            if name == "measurement":
                value = _measurement_dict(value)
                columns["median_ms"] = _median(value)
                value = None if value is None else _dumps(value)
            elif name == "extra":
                value = _dumps(value or {})
            columns[name] = value
        with self._write(f"updating candidate {candidate_id}") as db:
            assignments = ", ".join(f"{name} = ?" for name in columns) or "id = id"
            if db.execute(f"UPDATE candidates SET {assignments} WHERE id = ?",
                          (*columns.values(), candidate_id)).rowcount == 0:
                raise KeyError(f"{self.path} has no candidate {candidate_id}")

    def record_result(self, candidate_id: int, result: Any, reward: float | None = None) -> None:
        """Store an EvalResult's verdict on a candidate (committed before this returns).

        The compile log and evaluation timings go to the candidate's `extra`, merged with what is there.
        """
        current = self.candidate(candidate_id)
        if current is None:
            raise KeyError(f"{self.path} has no candidate {candidate_id}")
        extra = dict(current.extra)
        extra.update({"compile_log": result.compile_log, "compile_seconds": result.compile_seconds,
                      "compile_cached": result.compile_cached, "eval_seconds": result.eval_seconds})
        if result.details:
            extra["details"] = result.details
        self.update_candidate(candidate_id, status=result.status, reason=result.reason,
                              measurement=result.measurement, reward=reward, extra=extra)

    def _record(self, row: tuple) -> CandidateRecord:
        (cid, branch_id, parent_id, origin, kind, program, schedule, candidate_hash, status, reason,
         measurement, reward, created_at, evaluated_at, extra, source) = row
        program = _loads(program)
        if program is not None and "source" in program and program["source"] is None:
            program["source"] = source
        return CandidateRecord(
            id=cid, branch_id=branch_id, parent_id=parent_id, origin=origin, kind=kind, program=program,
            solution_source=source if kind == "modelnew" else None, schedule=_loads(schedule) or {},
            candidate_hash=candidate_hash, status=status, reason=reason, measurement=_loads(measurement),
            reward=reward, created_at=created_at, evaluated_at=evaluated_at, extra=_loads(extra) or {})

    def candidate(self, candidate_id: int) -> CandidateRecord | None:
        rows = self._query(f"SELECT {_CANDIDATE_COLUMNS} FROM {_CANDIDATE_FROM} WHERE c.id = ?", (candidate_id,))
        return self._record(rows[0]) if rows else None

    @staticmethod
    def _filters(branch_id: int | None, status: str | Iterable[str] | None,
                 parent_id: int | None = None) -> tuple[list[str], list[Any]]:
        where: list[str] = []
        params: list[Any] = []
        if branch_id is not None:
            where.append("c.branch_id = ?")
            params.append(branch_id)
        if status is not None:
            statuses = [status] if isinstance(status, str) else list(status)   # Status is a str enum
            statuses = [_status_text(s) for s in statuses]
            where.append(f"c.status IN ({', '.join('?' * len(statuses))})")
            params += statuses
        if parent_id is not None:
            where.append("c.parent_id = ?")
            params.append(parent_id)
        return where, params

    def candidates(self, branch_id: int | None = None, status: str | Iterable[str] | None = None,
                   since_id: int | None = None, limit: int | None = None,
                   parent_id: int | None = None) -> Iterator[CandidateRecord]:
        """Candidates in id order (ids above since_id), read a page at a time."""
        where, params = self._filters(branch_id, status, parent_id)
        last = since_id or 0
        left = limit
        while left is None or left > 0:
            page = PAGE if left is None else min(PAGE, left)
            rows = self._query(
                f"SELECT {_CANDIDATE_COLUMNS} FROM {_CANDIDATE_FROM} WHERE {' AND '.join(where + ['c.id > ?'])} "
                f"ORDER BY c.id LIMIT ?", (*params, last, page))
            for row in rows:
                yield self._record(row)
            if len(rows) < page:
                return
            last = rows[-1][0]
            left = None if left is None else left - len(rows)

    def summaries(self, status: str | Iterable[str] | None = None, since_id: int | None = None,
                  limit: int = PAGE) -> list[CandidateSummary]:
        """Up to `limit` candidates after since_id, in id order, as CandidateSummary: no program,
        source or measurement document is read or parsed."""
        where, params = self._filters(None, status)
        rows = self._query(
            "SELECT c.id, c.branch_id, c.parent_id, c.origin, c.schedule, c.status, c.reason, c.median_ms, "
            "c.reward, json_extract(c.measurement, '$.speedup_eager') FROM candidates c "
            f"WHERE {' AND '.join(where + ['c.id > ?'])} ORDER BY c.id LIMIT ?", (*params, since_id or 0, limit))
        return [CandidateSummary(cid, branch, parent, origin, _loads(schedule) or {}, status_, reason, median,
                                 reward, speedup)
                for cid, branch, parent, origin, schedule, status_, reason, median, reward, speedup in rows]

    def count(self, branch_id: int | None = None, status: str | Iterable[str] | None = None) -> int:
        where, params = self._filters(branch_id, status)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        return self._query(f"SELECT count(*) FROM candidates c{clause}", params)[0][0]

    def counts_by_status(self, branch_id: int | None = None) -> dict[str, int]:
        """{status: count} for the statuses present, in the order of records.STATUSES."""
        where, params = self._filters(branch_id, None)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        counts = dict(self._query(f"SELECT c.status, count(*) FROM candidates c{clause} GROUP BY c.status", params))
        return {s: counts.pop(s) for s in STATUSES if s in counts} | counts

    def counts_by_branch(self) -> dict[int, dict[str, int]]:
        """{branch id: {status: count}} in one pass over the status index."""
        out: dict[int, dict[str, int]] = {}
        for status, branch_id, n in self._query(
                "SELECT status, branch_id, count(*) FROM candidates GROUP BY status, branch_id"):
            out.setdefault(branch_id, {})[status] = n
        return {b: {s: c[s] for s in STATUSES if s in c} for b, c in out.items()}

    def best(self, n: int = 5, branch_id: int | None = None) -> list[CandidateRecord]:
        """The n fastest measured candidates (by median time), fastest first."""
        branch = "" if branch_id is None else " AND c.branch_id = ?"
        params = () if branch_id is None else (branch_id,)
        rows = self._query(
            f"SELECT {_CANDIDATE_COLUMNS} FROM {_CANDIDATE_FROM} WHERE c.status = 'measured' "
            f"AND c.median_ms IS NOT NULL{branch} ORDER BY c.median_ms, c.id LIMIT ?", (*params, n))
        return [self._record(r) for r in rows]

    # ---- policy checkpoints ------------------------------------------------------------------------

    KEEP_CHECKPOINTS = 3   # per policy: a run updates its policy every few candidates

    def save_checkpoint(self, policy: str, blob: bytes, meta: dict[str, Any] | None = None) -> PolicyCheckpoint:
        """Save a policy's state; only the newest KEEP_CHECKPOINTS of each policy are kept, so a long
        run's file grows with its candidates, not with its policy updates."""
        ckpt = PolicyCheckpoint(None, policy, now_iso(), dict(meta or {}), bytes(blob))
        with self._write(f"saving a checkpoint of {policy}") as db:
            ckpt.id = db.execute("INSERT INTO checkpoints (policy, created_at, meta, blob) VALUES (?, ?, ?, ?)",
                                 (policy, ckpt.created_at, _dumps(ckpt.meta), ckpt.blob)).lastrowid
            db.execute("DELETE FROM checkpoints WHERE policy = ? AND id NOT IN "
                       "(SELECT id FROM checkpoints WHERE policy = ? ORDER BY id DESC LIMIT ?)",
                       (policy, policy, self.KEEP_CHECKPOINTS))
        return ckpt

    def latest_checkpoint(self, policy: str) -> PolicyCheckpoint | None:
        rows = self._query("SELECT id, policy, created_at, meta, blob FROM checkpoints WHERE policy = ? "
                           "ORDER BY id DESC LIMIT 1", (policy,))
        if not rows:
            return None
        cid, policy, created_at, meta, blob = rows[0]
        return PolicyCheckpoint(cid, policy, created_at, _loads(meta) or {}, bytes(blob))

    def checkpoint_counts(self) -> dict[str, int]:
        return dict(self._query("SELECT policy, count(*) FROM checkpoints GROUP BY policy ORDER BY policy"))

    # ---- settings and view state (JSON values) ------------------------------------------------------

    def _get(self, table: str, key: str, default: Any) -> Any:
        rows = self._query(f"SELECT value FROM {table} WHERE key = ?", (key,))
        return _loads(rows[0][0]) if rows else default

    def _set(self, table: str, key: str, value: Any) -> None:
        with self._write(f"saving {table} '{key}'") as db:
            db.execute(f"INSERT OR REPLACE INTO {table} (key, value) VALUES (?, ?)", (key, _dumps(value)))

    def get_setting(self, key: str, default: Any = None) -> Any:
        return self._get("settings", key, default)

    def set_setting(self, key: str, value: Any) -> None:
        self._set("settings", key, value)

    def settings(self) -> dict[str, Any]:
        return {k: _loads(v) for k, v in self._query("SELECT key, value FROM settings ORDER BY key")}

    def get_view_state(self, key: str, default: Any = None) -> Any:
        return self._get("view_state", key, default)

    def set_view_state(self, key: str, value: Any) -> None:
        self._set("view_state", key, value)

    def view_state(self) -> dict[str, Any]:
        return {k: _loads(v) for k, v in self._query("SELECT key, value FROM view_state ORDER BY key")}

    # ---- run sessions ------------------------------------------------------------------------------

    @property
    def current_run(self) -> int | None:
        """The id of the run this object started and has not stopped."""
        return self._run_id

    def run_started(self, meta: dict[str, Any] | None = None, resumes: int | None = None) -> RunSession:
        """Record a live run and switch to WAL, so readers never wait for it.

        resumes: an unfinished (killed) run this one continues; it is closed as not clean.
        """
        if self.readonly:
            raise ProjectError(f"{self.path} is open read-only; starting a run needs it open for writing.")
        if self._run_id is not None:
            raise ProjectError(f"{self.path}: a run (#{self._run_id}) is already live in this process.")
        with self._lock:
            self._set_journal_mode("wal")
            run = RunSession(0, now_iso(), pid=os.getpid(), host=socket.gethostname(), resumed_from=resumes,
                             meta=dict(meta or {}))
            with self._write("starting a run") as db:
                if resumes is not None:
                    db.execute("UPDATE runs SET stopped_at = ?, clean = 0 WHERE id = ? AND stopped_at IS NULL",
                               (run.started_at, resumes))
                run.id = db.execute(
                    "INSERT INTO runs (started_at, pid, host, resumed_from, meta) VALUES (?, ?, ?, ?, ?)",
                    (run.started_at, run.pid, run.host, resumes, _dumps(run.meta))).lastrowid
            self._run_id = run.id
        return run

    def run_stopped(self, clean: bool = True) -> None:
        """Record the end of this process's run, fold the WAL back into the file, leave WAL."""
        with self._lock:
            if self._run_id is None:
                return
            with self._write("stopping the run") as db:
                db.execute("UPDATE runs SET stopped_at = ?, clean = ? WHERE id = ?",
                           (now_iso(), int(clean), self._run_id))
            self._run_id = None
            self._set_journal_mode("delete")

    def _set_journal_mode(self, mode: str) -> None:
        """Best effort: leaving WAL needs every other connection gone; if a reader is still
        there the file stays in WAL (still one file once the last connection closes)."""
        db = self._db
        try:
            db.execute("PRAGMA busy_timeout = 500")   # do not hold up a run for a reader: try briefly
            if mode == "delete":
                db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            db.execute(f"PRAGMA journal_mode = {mode}").fetchall()
        except sqlite3.OperationalError:
            pass
        finally:
            db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")

    def _run(self, row: tuple) -> RunSession:
        rid, started, stopped, clean, pid, host, resumed_from, meta = row
        return RunSession(rid, started, stopped, None if clean is None else bool(clean), pid, host, resumed_from,
                          _loads(meta) or {})

    def runs(self) -> list[RunSession]:
        return [self._run(r) for r in self._query(f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY id")]

    def unfinished_runs(self) -> list[RunSession]:
        """Runs that never recorded their end: killed, or live in another process (see run_may_be_live)."""
        rows = self._query(f"SELECT {_RUN_COLUMNS} FROM runs WHERE stopped_at IS NULL AND id IS NOT ? ORDER BY id",
                           (self._run_id,))
        return [self._run(r) for r in rows]


def run_may_be_live(run: RunSession) -> bool:
    """True when the run's process still exists on this machine (or may, on another one)."""
    if run.finished:
        return False
    if run.host != socket.gethostname() or run.pid is None or os.name == "nt":
        return True   # (on Windows os.kill(pid, 0) would send CTRL_C_EVENT)
    try:
        os.kill(run.pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # exists but belongs to someone else, or the platform cannot tell
        return True
    return True
