"""Schema versions of the project file and the steps between them.

The schema version lives in `PRAGMA user_version`. A new project gets CURRENT_DDL. An older file
is upgraded by applying, in order, every step of MIGRATIONS whose target version is above the
file's version; each step runs in its own transaction together with the version bump.

History is kept verbatim (SCHEMA_HISTORY) so tests can build a file of every earlier version and
check that migrating it gives exactly the schema of a fresh project. To change the schema: copy
CURRENT_DDL into SCHEMA_HISTORY under the current number, edit CURRENT_DDL, bump
CURRENT_VERSION, append a step (columns added by ALTER TABLE go at the end of CURRENT_DDL's
table so both paths agree), and describe it in docs/project-file.md.
"""
from __future__ import annotations

import sqlite3
from typing import Callable

# PRAGMA application_id: "CUDA" in ASCII. A SQLite file without it is not ours.
APPLICATION_ID = 0x43554441
CURRENT_VERSION = 2

# Version 1 (first release): view state lived in `settings` under keys "view.<name>", and
# candidates had no `extra` column.
V1_DDL = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE baselines (gpu_key TEXT PRIMARY KEY, json TEXT NOT NULL, updated_at TEXT NOT NULL);
CREATE TABLE branches (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    parent_candidate_id INTEGER REFERENCES candidates(id),
    created_at TEXT NOT NULL
);
CREATE TABLE sources (hash TEXT PRIMARY KEY, text TEXT NOT NULL);
CREATE TABLE candidates (
    id INTEGER PRIMARY KEY,
    branch_id INTEGER NOT NULL REFERENCES branches(id),
    parent_id INTEGER REFERENCES candidates(id),
    origin TEXT NOT NULL,
    kind TEXT NOT NULL,
    program TEXT,
    source_hash TEXT REFERENCES sources(hash),
    schedule TEXT NOT NULL,
    candidate_hash TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    measurement TEXT,
    median_ms REAL,
    reward REAL,
    created_at TEXT NOT NULL,
    evaluated_at TEXT
);
CREATE INDEX candidates_branch ON candidates(branch_id, id);
CREATE INDEX candidates_status ON candidates(status, branch_id);
CREATE INDEX candidates_parent ON candidates(parent_id);
CREATE INDEX candidates_hash ON candidates(candidate_hash);
CREATE INDEX candidates_best ON candidates(median_ms) WHERE status = 'measured' AND median_ms IS NOT NULL;
CREATE TABLE checkpoints (
    id INTEGER PRIMARY KEY,
    policy TEXT NOT NULL,
    created_at TEXT NOT NULL,
    meta TEXT NOT NULL,
    blob BLOB NOT NULL
);
CREATE INDEX checkpoints_policy ON checkpoints(policy, id);
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    started_at TEXT NOT NULL,
    stopped_at TEXT,
    clean INTEGER,
    pid INTEGER,
    host TEXT NOT NULL DEFAULT '',
    resumed_from INTEGER REFERENCES runs(id),
    meta TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

# Version 2: view state (window layout, selected branch, plot ranges) has its own table, and a
# candidate carries `extra` (compile log, timings of the evaluation, policy details).
CURRENT_DDL = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE baselines (gpu_key TEXT PRIMARY KEY, json TEXT NOT NULL, updated_at TEXT NOT NULL);
CREATE TABLE branches (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    parent_candidate_id INTEGER REFERENCES candidates(id),
    created_at TEXT NOT NULL
);
CREATE TABLE sources (hash TEXT PRIMARY KEY, text TEXT NOT NULL);
CREATE TABLE candidates (
    id INTEGER PRIMARY KEY,
    branch_id INTEGER NOT NULL REFERENCES branches(id),
    parent_id INTEGER REFERENCES candidates(id),
    origin TEXT NOT NULL,
    kind TEXT NOT NULL,
    program TEXT,
    source_hash TEXT REFERENCES sources(hash),
    schedule TEXT NOT NULL,
    candidate_hash TEXT NOT NULL,
    status TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT '',
    measurement TEXT,
    median_ms REAL,
    reward REAL,
    created_at TEXT NOT NULL,
    evaluated_at TEXT,
    extra TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX candidates_branch ON candidates(branch_id, id);
CREATE INDEX candidates_status ON candidates(status, branch_id);
CREATE INDEX candidates_parent ON candidates(parent_id);
CREATE INDEX candidates_hash ON candidates(candidate_hash);
CREATE INDEX candidates_best ON candidates(median_ms) WHERE status = 'measured' AND median_ms IS NOT NULL;
CREATE TABLE checkpoints (
    id INTEGER PRIMARY KEY,
    policy TEXT NOT NULL,
    created_at TEXT NOT NULL,
    meta TEXT NOT NULL,
    blob BLOB NOT NULL
);
CREATE INDEX checkpoints_policy ON checkpoints(policy, id);
CREATE TABLE runs (
    id INTEGER PRIMARY KEY,
    started_at TEXT NOT NULL,
    stopped_at TEXT,
    clean INTEGER,
    pid INTEGER,
    host TEXT NOT NULL DEFAULT '',
    resumed_from INTEGER REFERENCES runs(id),
    meta TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE view_state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

SCHEMA_HISTORY: dict[int, str] = {1: V1_DDL}


def _v1_to_v2(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE candidates ADD COLUMN extra TEXT NOT NULL DEFAULT '{}'")
    db.execute("CREATE TABLE view_state (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    # exact prefix match: LIKE would also take "VIEW.x" (it ignores ASCII case)
    db.execute("INSERT INTO view_state (key, value) "
               "SELECT substr(key, 6), value FROM settings WHERE substr(key, 1, 5) = 'view.'")
    db.execute("DELETE FROM settings WHERE substr(key, 1, 5) = 'view.'")


# (target version, step): the step turns a file of version target-1 into target.
MIGRATIONS: list[tuple[int, Callable[[sqlite3.Connection], None]]] = [
    (2, _v1_to_v2),
]


def steps_from(version: int) -> list[tuple[int, Callable[[sqlite3.Connection], None]]]:
    """The steps that bring a file of `version` to CURRENT_VERSION, in order."""
    return [(target, step) for target, step in MIGRATIONS if target > version]
