"""The project file: round trips, migrations, refusals that leave files untouched, concurrent
readers, kill -9 mid-run, and a 50,000-candidate project that opens instantly."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.evaluation.evaluator import Baselines
from core.evaluation.results import EvalResult, Status, Timing
from core.program import KernelProgram, load_solution
from core.project import (APPLICATION_ID, CURRENT_VERSION, STATUSES, CandidateRecord, Project, ProjectError,
                          run_may_be_live)
from core.project import migrations, store
from core.project.inspect import format_summary, summarize
from core.project.records import FINAL_STATUSES
from core.tasks import load_task
from tests.support.project_writer import make_records

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = sorted((ROOT / "resources" / "programs").glob("*.json"))
HARDWARE = {"name": "NVIDIA H200", "arch": "sm_90", "capability": "9.0", "sms": 132,
            "memory_bytes": 150_000_000_000, "torch": "2.11.0+cu130"}


@pytest.fixture(scope="module")
def task():
    return load_task(ROOT / "resources" / "tasks" / "act_gelu.py")


@pytest.fixture
def project_path(tmp_path, task) -> Path:
    """A closed project with a few evaluated candidates."""
    path = tmp_path / "gelu.cuagent"
    with Project.create(path, task, HARDWARE) as project:
        project.add_candidates(make_records(40, seed=3))
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def writer(path: Path, count: int, delay: float = 0.0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.support.project_writer", str(path), str(count),
                             "--delay", str(delay)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def schema_of(db: sqlite3.Connection) -> dict:
    """Tables (columns in order, foreign keys) and indexes, for comparing migrated with fresh files."""
    out = {}
    for name, kind, sql in db.execute("SELECT name, type, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"):
        if kind == "table":
            out[name] = (list(db.execute(f"PRAGMA table_info('{name}')")),
                         sorted(db.execute(f"PRAGMA foreign_key_list('{name}')")))
        else:
            out[name] = " ".join(sql.split())
    return out


# ---- round trip -----------------------------------------------------------------------------------


def test_statuses_are_the_evaluators_plus_pending():
    assert set(FINAL_STATUSES) == {s.value for s in Status}
    assert STATUSES[:2] == ("queued", "compiled")


def test_everything_written_reads_back_the_same(tmp_path, task):
    path = tmp_path / "roundtrip.cuagent"
    baselines = Baselines(eager=Timing(1.5, 1.4, 1.9, 1.45, 1.6, 40), compile=Timing(1.1, 1.0, 1.3, 1.05, 1.2, 40),
                          task_hash=task.hash, gpu="NVIDIA H200", measured_at="2026-11-30T10:00:00")
    with Project.create(path, task, HARDWARE) as project:
        assert project.schema_version == CURRENT_VERSION
        assert [b.name for b in project.branches()] == ["main"]
        project.set_baselines("NVIDIA-H200-9.0-torch2.11.0", baselines)
        written = []
        for file in PROGRAMS:
            program = KernelProgram.load(file)
            rec = CandidateRecord.from_program(program, origin="user")
            project.add_candidate(rec)
            written.append(rec)
        fork = project.add_branch("wide blocks", parent_candidate_id=written[0].id)
        solution = load_solution(ROOT / "resources" / "programs" / "act_gelu_modelnew.py")
        modelnew = CandidateRecord.from_solution(solution, branch_id=fork.id, parent_id=written[0].id, origin="llm")
        project.add_candidate(modelnew)
        written.append(modelnew)
        measured = next(r for r in make_records(50, seed=5) if r.status == "measured")
        result = EvalResult(Status.MEASURED, measurement=measured.measurement, compile_log="ptxas info: 32 registers",
                            compile_seconds=0.8, eval_seconds=2.5, candidate_hash=written[0].candidate_hash)
        project.record_result(written[0].id, result, reward=0.7)
        ckpt = project.save_checkpoint("ppo", b"\x00weights\xff" * 100, {"updates": 12})
        project.set_setting("policy", {"name": "ppo", "lr": 3e-4})
        project.set_view_state("selected_branch", fork.id)
        before = [project.candidate(r.id) for r in written]

    with Project.open(path) as project:
        assert project.task_name == "act_gelu" and project.task_hash == task.hash
        assert project.task_source == task.source and project.load_task().hash == task.hash
        assert project.hardware == HARDWARE
        assert project.baselines("NVIDIA-H200-9.0-torch2.11.0") == baselines
        assert project.baselines("another-gpu") is None
        assert [b.name for b in project.branches()] == ["main", "wide blocks"]
        assert project.branch("wide blocks").parent_candidate_id == written[0].id
        after = [project.candidate(r.id) for r in written]
        assert after == before
        for rec, file in zip(after, PROGRAMS):   # programs come back whole, and hash the same
            assert rec.program == KernelProgram.load(file).to_dict() or rec.id == written[0].id
            assert KernelProgram.from_json(rec.program).content_hash() == rec.candidate_hash
        first = after[0]
        assert first.status == "measured" and first.reward == 0.7 and first.evaluated_at
        assert first.measurement == measured.measurement and first.median_ms == measured.median_ms
        assert first.extra["compile_log"] == "ptxas info: 32 registers"
        assert after[-1].kind == "modelnew" and after[-1].solution_source == solution.source
        assert after[-1].program is None
        assert project.latest_checkpoint("ppo") == ckpt
        assert project.latest_checkpoint("random") is None
        assert project.get_setting("policy") == {"name": "ppo", "lr": 3e-4}
        assert project.get_setting("missing", 5) == 5
        assert project.view_state() == {"selected_branch": fork.id}


def test_sources_are_stored_once(tmp_path, task):
    with Project.create(tmp_path / "p.cuagent", task) as project:
        project.add_candidates(make_records(300, seed=1))
        n_sources = project._query("SELECT count(*) FROM sources")[0][0]
        assert n_sources <= len(PROGRAMS)
        assert all(r.program["source"] for r in project.candidates())


def test_queries_filter_page_and_sort(tmp_path, task):
    with Project.create(tmp_path / "q.cuagent", task) as project:
        fork = project.add_branch("fork")
        records = list(make_records(1300, seed=2, branch_ids=(1, fork.id)))
        ids = project.add_candidates(records)
        assert ids == list(range(1, 1301)) and [r.id for r in records] == ids
        assert [r.id for r in project.candidates()] == ids   # pages of 500 joined seamlessly
        assert [r.id for r in project.candidates(branch_id=fork.id)] == ids[1::2]
        assert [r.id for r in project.candidates(since_id=1000, limit=7)] == ids[1000:1007]
        wrong = [r.id for r in records if r.status == "wrong"]
        assert [r.id for r in project.candidates(status="wrong")] == wrong
        assert project.count(status=[Status.WRONG, "crashed"]) == sum(r.status in ("wrong", "crashed") for r in records)
        counts = project.counts_by_status()
        assert sum(counts.values()) == project.count() == 1300
        assert counts == {s: n for s in STATUSES if (n := sum(r.status == s for r in records))}
        assert project.counts_by_branch()[fork.id] == project.counts_by_status(branch_id=fork.id)
        measured = sorted((r for r in records if r.status == "measured"), key=lambda r: (r.median_ms, r.id))
        assert [r.id for r in project.best(10)] == [r.id for r in measured[:10]]
        assert [r.id for r in project.best(3, branch_id=fork.id)] == [r.id for r in measured if r.branch_id == fork.id][:3]


def test_update_rules(tmp_path, task):
    with Project.create(tmp_path / "u.cuagent", task) as project:
        cid = project.add_candidate(CandidateRecord.from_program(KernelProgram.load(PROGRAMS[0])))
        project.update_candidate(cid, status="compiled")
        assert project.candidate(cid).evaluated_at is None
        project.update_candidate(cid, status=Status.WRONG, reason="max abs error 0.3")
        rec = project.candidate(cid)
        assert rec.status == "wrong" and rec.evaluated_at and rec.reason == "max abs error 0.3"
        with pytest.raises(ValueError, match="program"):
            project.update_candidate(cid, program={})   # a changed kernel is a new candidate
        with pytest.raises(ValueError, match="status"):
            project.update_candidate(cid, status="great")
        with pytest.raises(KeyError):
            project.update_candidate(999, status="wrong")
        with pytest.raises(ProjectError, match="constraints"):
            project.add_candidate(CandidateRecord.from_program(KernelProgram.load(PROGRAMS[0]), branch_id=42))
        with pytest.raises(ProjectError, match="already has a branch"):
            project.add_branch("main")
        assert project.count() == 1


def test_create_never_replaces_a_file(tmp_path, task):
    path = tmp_path / "taken.cuagent"
    path.write_text("my notes")
    with pytest.raises(ProjectError, match="already exists"):
        Project.create(path, task)
    assert path.read_text() == "my notes" and listing(tmp_path) == ["taken.cuagent"]


def test_readonly_open_never_writes(project_path):
    before, files = sha(project_path), listing(project_path.parent)
    with Project.open(project_path, readonly=True) as project:
        assert project.count() == 40
        summarize(project)
        with pytest.raises(ProjectError, match="read-only"):
            project.set_setting("x", 1)
        with pytest.raises(ProjectError, match="read-only"):
            project.run_started()
    assert sha(project_path) == before and listing(project_path.parent) == files


# ---- files that are refused, untouched ------------------------------------------------------------


def _foreign(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY, name TEXT)")
    db.execute("INSERT INTO photos (name) VALUES ('cat.jpg')")
    db.commit()
    db.close()


def _pragma(statement: str):
    def damage(path: Path) -> None:
        db = sqlite3.connect(path)
        db.execute(statement)
        db.commit()
        db.close()
    return damage


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garble_page(path: Path) -> None:
    data = bytearray(path.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    middle = (len(data) // page // 2) * page
    data[middle:middle + page] = os.urandom(page)
    path.write_bytes(bytes(data))


def _garble_schema(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[100:1000] = b"\xa5" * 900   # the page that holds sqlite_master
    path.write_bytes(bytes(data))


REFUSALS = {
    "empty": (lambda p: p.write_bytes(b""), "is empty"),
    "text": (lambda p: p.write_text("task = 'gelu'\n" * 100), "not an SQLite database"),
    "foreign": (_foreign, "foreign SQLite file"),
    "newer": (_pragma("PRAGMA user_version = 7"), "newer CUDA Agent (schema 7, this version reads up to 2)"),
    "unversioned": (_pragma("PRAGMA user_version = 0"), "has no schema version"),
    "other app id": (_pragma("PRAGMA application_id = 1234"), "foreign SQLite file"),
    "truncated": (_truncate, "is damaged: it is truncated"),
    "garbled page": (_garble_page, "is damaged"),
    "garbled schema": (_garble_schema, "is damaged"),
}


@pytest.mark.parametrize("readonly", [False, True], ids=["write", "readonly"])
@pytest.mark.parametrize("case", list(REFUSALS))
def test_bad_files_are_refused_and_left_untouched(tmp_path, project_path, case, readonly):
    damage, message = REFUSALS[case]
    path = tmp_path / "bad.cuagent"
    if case not in ("empty", "text", "foreign"):   # those make the file themselves
        path.write_bytes(project_path.read_bytes())
    damage(path)
    before, files = sha(path), listing(tmp_path)
    with pytest.raises(ProjectError) as info:
        Project.open(path, readonly=readonly)
    text = str(info.value)
    assert str(path) in text and message in text and "not modified" in text
    assert sha(path) == before and listing(tmp_path) == files


def test_big_files_check_the_small_tables_on_open_and_everything_on_demand(tmp_path, project_path, monkeypatch):
    path = tmp_path / "damaged.cuagent"
    path.write_bytes(project_path.read_bytes())
    db = sqlite3.connect(path)
    root = db.execute("SELECT rootpage FROM sqlite_master WHERE name = 'candidates'").fetchone()[0]
    page = db.execute("PRAGMA page_size").fetchone()[0]
    db.close()
    data = bytearray(path.read_bytes())
    data[(root - 1) * page:root * page] = b"\xa5" * page   # the candidates table's root page
    path.write_bytes(bytes(data))
    with pytest.raises(ProjectError, match="is damaged"):   # a small file gets the full check
        Project.open(path)
    monkeypatch.setattr(store, "FULL_CHECK_MAX_BYTES", 0)   # as if it were a huge file
    with Project.open(path, readonly=True) as project:
        assert project.task_name == "act_gelu" and project.branches()
        assert project.verify()
        with pytest.raises(ProjectError, match=f"{path} is damaged"):
            list(project.candidates())
    _garble_schema(path)
    with pytest.raises(ProjectError, match="is damaged"):
        Project.open(path, readonly=True)


def test_missing_file_and_folder_are_clear_errors(tmp_path):
    with pytest.raises(ProjectError, match="no such file"):
        Project.open(tmp_path / "nope.cuagent")
    with pytest.raises(ProjectError, match="not a file"):
        Project.open(tmp_path)


# ---- migrations -----------------------------------------------------------------------------------


def _fill_v1(db: sqlite3.Connection, task) -> None:
    """What a version-1 CUDA Agent wrote: view state in settings under "view.", no candidate extra."""
    meta = {"task_name": task.name, "task_source": task.source, "task_hash": task.hash, "hardware": HARDWARE,
            "created_at": "2026-10-01T09:00:00.000+00:00", "created_with": "0.0.9"}
    db.executemany("INSERT INTO meta VALUES (?, ?)", [(k, json.dumps(v)) for k, v in meta.items()])
    db.execute("INSERT INTO branches VALUES (1, 'main', NULL, '2026-10-01T09:00:00.000+00:00')")
    for i, rec in enumerate(make_records(25, seed=9), start=1):
        program = dict(rec.program, source=None)
        source_hash = hashlib.sha256(rec.program["source"].encode()).hexdigest()
        db.execute("INSERT OR IGNORE INTO sources VALUES (?, ?)", (source_hash, rec.program["source"]))
        db.execute("INSERT INTO candidates VALUES (?, 1, ?, ?, 'program', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (i, i - 1 or None, rec.origin, json.dumps(program), source_hash, json.dumps(rec.schedule),
                    rec.candidate_hash, rec.status, rec.reason,
                    None if rec.measurement is None else json.dumps(rec.measurement), rec.median_ms, rec.reward,
                    rec.created_at, rec.evaluated_at))
    db.execute("INSERT INTO runs (started_at, stopped_at, clean, pid, host) VALUES ('a', 'b', 1, 1, 'h')")
    db.executemany("INSERT INTO settings VALUES (?, ?)", [("policy", '"ppo"'), ("view.splitter", "[300, 700]"),
                                                          ("view.selected_branch", "1")])


FILLERS = {1: _fill_v1}


def make_old_project(path: Path, version: int, task) -> None:
    db = sqlite3.connect(path)
    db.executescript(migrations.SCHEMA_HISTORY[version])
    FILLERS[version](db, task)
    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    db.execute(f"PRAGMA user_version = {version}")
    db.commit()
    db.close()


def test_every_step_and_every_old_schema_is_covered():
    assert [target for target, _ in migrations.MIGRATIONS] == list(range(2, CURRENT_VERSION + 1))
    assert sorted(migrations.SCHEMA_HISTORY) == list(range(1, CURRENT_VERSION)) == sorted(FILLERS)


@pytest.mark.parametrize("version", sorted(migrations.SCHEMA_HISTORY))
def test_old_versions_are_migrated_with_a_backup(tmp_path, task, version):
    path = tmp_path / "old.cuagent"
    make_old_project(path, version, task)
    original = sha(path)
    fresh = tmp_path / "fresh.cuagent"
    Project.create(fresh, task).close()

    with Project.open(path, readonly=True) as project:   # read-only: upgraded in memory, file untouched
        assert project.migrated_from == version and project.count() == 25
    assert sha(path) == original and not list(tmp_path.glob("*.bak-*"))

    with Project.open(path) as project:
        assert project.migrated_from == version and project.schema_version == CURRENT_VERSION
        assert project.backup_path == tmp_path / f"old.cuagent.bak-v{version}"
        assert project.count() == 25 and project.task_hash == task.hash and project.hardware == HARDWARE
        assert all(r.extra == {} for r in project.candidates())
        assert [r.candidate_hash for r in project.candidates()] == [r.candidate_hash for r in make_records(25, seed=9)]
        assert project.settings() == {"policy": "ppo"}
        assert project.view_state() == {"splitter": [300, 700], "selected_branch": 1}
        assert project.verify() == []
    with sqlite3.connect(path) as db, sqlite3.connect(fresh) as fresh_db:
        assert schema_of(db) == schema_of(fresh_db)
    backup = sqlite3.connect(project.backup_path)
    assert backup.execute("PRAGMA user_version").fetchone()[0] == version
    assert backup.execute("SELECT count(*) FROM candidates").fetchone()[0] == 25
    backup.close()
    with Project.open(path) as project:   # already current: no second backup
        assert project.migrated_from is None
    assert len(list(tmp_path.glob("*.bak-*"))) == 1


def test_a_backup_is_never_overwritten(tmp_path, task):
    path = tmp_path / "old.cuagent"
    make_old_project(path, 1, task)
    (tmp_path / "old.cuagent.bak-v1").write_text("an earlier backup")
    with Project.open(path) as project:
        assert project.backup_path == tmp_path / "old.cuagent.bak-v1-2"
    assert (tmp_path / "old.cuagent.bak-v1").read_text() == "an earlier backup"


def test_a_failed_migration_leaves_the_file_at_its_version(tmp_path, task, monkeypatch):
    path = tmp_path / "old.cuagent"
    make_old_project(path, 1, task)

    def broken(db):
        db.execute("ALTER TABLE candidates ADD COLUMN extra TEXT NOT NULL DEFAULT '{}'")
        raise RuntimeError("disk full")

    monkeypatch.setattr(migrations, "MIGRATIONS", [(2, broken)])
    with pytest.raises(ProjectError, match=r"schema 1 to 2 failed \(disk full\).*left at schema 1.*bak-v1"):
        Project.open(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == 1
    assert "extra" not in [c[1] for c in db.execute("PRAGMA table_info(candidates)")]
    db.close()


# ---- runs: WAL, concurrent readers, kill -9 ------------------------------------------------------


def test_wal_only_while_a_run_is_live(project_path):
    with Project.open(project_path) as project:
        assert project.journal_mode == "delete"
        run = project.run_started(meta={"policy": "ppo"})
        assert project.journal_mode == "wal" and project.unfinished_runs() == []
        project.add_candidates(make_records(5))
        project.run_stopped()
        assert project.journal_mode == "delete"
        assert not Path(f"{project_path}-wal").exists()
        (stored,) = project.runs()
        assert stored.id == run.id and stored.clean is True and stored.meta == {"policy": "ppo"}


def test_a_reader_sees_a_live_run_grow(project_path):
    proc = writer(project_path, 150, delay=0.005)
    seen, partial = [], 0
    try:
        assert proc.stdout.readline().startswith("run ")
        while proc.poll() is None:
            with Project.open(project_path, readonly=True) as project:
                n = project.count()
                newest = list(project.candidates(since_id=max(n - 3, 0)))
                assert all(r.status != "queued" or r.id == newest[-1].id for r in newest)
            seen.append(n)
            partial += 40 < n < 190
    finally:
        out, errors = proc.communicate(timeout=60)
    assert proc.returncode == 0, errors
    assert seen == sorted(seen) and partial >= 2, seen
    with Project.open(project_path, readonly=True) as project:
        assert project.count() == 190 and project.unfinished_runs() == []


def test_kill_9_mid_run_loses_nothing_evaluated(project_path):
    proc = writer(project_path, 100_000)
    assert proc.stdout.readline().startswith("run ")
    printed = [int(proc.stdout.readline()) for _ in range(60)]
    os.kill(proc.pid, signal.SIGKILL)
    rest, _ = proc.communicate(timeout=30)
    printed += [int(line) for line in rest.split()]   # ids printed before the kill, still in the pipe
    assert proc.returncode == -signal.SIGKILL

    with Project.open(project_path, readonly=True) as project:   # a reader can look before any recovery
        assert project.count() >= 40 + len(printed)
    with Project.open(project_path) as project:
        assert project.verify() == []
        assert project._query("PRAGMA integrity_check") == [("ok",)]
        for cid in printed:
            rec = project.candidate(cid)
            assert rec is not None and rec.status in FINAL_STATUSES and rec.evaluated_at
        in_flight = project.count(status="queued")
        assert in_flight <= 1   # at most the candidate being evaluated when it died
        (killed,) = project.unfinished_runs()
        assert not run_may_be_live(killed) and killed.pid == proc.pid
        assert "may still be running" not in format_summary(summarize(project))
        resumed = project.run_started(resumes=killed.id)
        assert project.unfinished_runs() == []
        project.run_stopped()
        runs = {r.id: r for r in project.runs()}
        assert runs[killed.id].clean is False and runs[resumed.id].resumed_from == killed.id


def test_a_write_cut_off_outside_a_run_is_undone(project_path):
    """A process killed mid-transaction in rollback-journal mode leaves a hot journal."""
    code = (
        "import os, sqlite3, sys\n"
        "db = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
        "db.execute('PRAGMA cache_size = 2')\n"   # so the half-done write reaches the file
        "db.execute('BEGIN')\n"
        "db.executemany('INSERT INTO settings VALUES (?, ?)', [(f'k{i}', '\"' + 'x' * 500 + '\"') for i in range(2000)])\n"
        "db.execute('UPDATE candidates SET reason = \\'half-written\\'')\n"
        "os._exit(9)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(project_path)], check=False, timeout=60)
    assert Path(f"{project_path}-journal").stat().st_size > 0
    before = sha(project_path)
    with pytest.raises(ProjectError, match="middle of a write"):
        Project.open(project_path, readonly=True)
    assert sha(project_path) == before
    with Project.open(project_path) as project:
        assert project.verify() == [] and project.settings() == {}
        assert not any(r.reason == "half-written" for r in project.candidates())
        assert project.count() == 40


# ---- size -----------------------------------------------------------------------------------------


def test_a_50000_candidate_project_opens_in_under_2_seconds(tmp_path, task):
    path = tmp_path / "big.cuagent"
    pool = list(make_records(1000, seed=4))
    with Project.create(path, task, HARDWARE) as project:
        branches = [1, project.add_branch("fork a").id, project.add_branch("fork b").id]
        records = [dataclasses.replace(pool[i % 1000], branch_id=branches[i % 3]) for i in range(50_000)]
        project.add_candidates(records)
    assert path.stat().st_size > 50_000 * 1000   # ~1 KB of measurement each, really stored

    start = time.perf_counter()
    with Project.open(path) as project:
        counts = project.counts_by_status()
        best = project.best()
        first_page = list(project.candidates(limit=100))
        opened = time.perf_counter() - start
        summary = summarize(project)
        summarized = time.perf_counter() - start - opened
    print(f"\n50,000 candidates ({path.stat().st_size / 2**20:.0f} MiB): open + counts + best + first page "
          f"{opened * 1e3:.0f} ms; inspect summary {summarized * 1e3:.0f} ms")
    assert opened < 2.0
    assert summarized < 2.0
    assert sum(counts.values()) == 50_000 and len(first_page) == 100 and len(best) == 5
    assert best[0].median_ms == min(r.median_ms for r in pool if r.status == "measured")
    assert summary["total"] == 50_000 and [b["candidates"] for b in summary["branches"]] == [16667, 16667, 16666]


# ---- inspect --------------------------------------------------------------------------------------


def test_summary_data_and_text(project_path, task):
    with Project.open(project_path) as project:
        fork = project.add_branch("fork", parent_candidate_id=3)
        project.add_candidates(make_records(10, seed=8, branch_ids=(fork.id,)))
        project.set_baselines("NVIDIA-H200-9.0-torch2.11.0+cu130",
                              Baselines(eager=Timing(1.5, 1.4, 1.9, 1.45, 1.6, 40), task_hash=task.hash))
        project.save_checkpoint("ppo", b"w")
        s = summarize(project)
        best = project.best()
    assert s["task"] == {"name": "act_gelu", "hash": task.hash}
    assert s["total"] == 50 and sum(s["counts"].values()) == 50
    assert [(b["name"], b["candidates"]) for b in s["branches"]] == [("main", 40), ("fork", 10)]
    assert [r["id"] for r in s["best"]] == [r.id for r in best]
    assert s["best"][0]["median_ms"] == best[0].median_ms
    assert s["best"][0]["speedup_eager"] == best[0].measurement["speedup_eager"]
    assert s["baselines"]["NVIDIA-H200-9.0-torch2.11.0+cu130"]["eager_ms"] == 1.5
    assert s["checkpoints"] == {"ppo": 1}
    json.dumps(s)
    text = format_summary(s)
    for piece in ("act_gelu", "NVIDIA H200 (sm_90, 132 SMs", "fork", "from #3", "Best candidates",
                  f"#{best[0].id}", "eager 1.500 ms", "ppo 1"):
        assert piece in text, piece


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "core.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def test_cli_inspect(project_path):
    before = sha(project_path)
    done = run_cli("inspect", str(project_path))
    assert done.returncode == 0, done.stderr
    assert "act_gelu" in done.stdout and "Best candidates" in done.stdout and "main" in done.stdout
    as_json = run_cli("inspect", str(project_path), "--json")
    assert as_json.returncode == 0, as_json.stderr
    data = json.loads(as_json.stdout)
    assert data["total"] == 40 and data["schema_version"] == CURRENT_VERSION
    assert sha(project_path) == before


def test_cli_inspect_refuses_a_foreign_file_clearly(tmp_path):
    path = tmp_path / "photos.db"
    _foreign(path)
    done = run_cli("inspect", str(path))
    assert done.returncode == 2
    assert "project error" in done.stderr and "foreign SQLite file" in done.stderr and "photos.db" in done.stderr
    assert "Traceback" not in done.stderr


def test_only_the_newest_checkpoints_of_each_policy_are_kept(tmp_path, task):
    with Project.create(tmp_path / "p.cuagent", task) as project:
        saved = [project.save_checkpoint("ppo", bytes([i]) * 1000, {"updates": i}) for i in range(10)]
        other = project.save_checkpoint("evolution", b"x", {})
        assert project.checkpoint_counts() == {"evolution": 1, "ppo": Project.KEEP_CHECKPOINTS}
        assert project.latest_checkpoint("ppo") == saved[-1]
        assert project.latest_checkpoint("evolution") == other


def test_compact_drops_old_checkpoints_of_older_files_and_shrinks_the_file(tmp_path, task):
    path = tmp_path / "old.cuagent"
    Project.create(path, task).close()
    db = sqlite3.connect(path)   # as a file written before checkpoints were pruned
    with db:
        for i in range(20):
            db.execute("INSERT INTO checkpoints (policy, created_at, meta, blob) VALUES ('ppo', 'then', '{}', ?)",
                       (os.urandom(100_000),))
    db.close()
    with Project.open(path) as project:
        newest = project.latest_checkpoint("ppo")
        saved = project.compact()
        assert project.checkpoint_counts() == {"ppo": Project.KEEP_CHECKPOINTS}
        assert project.latest_checkpoint("ppo") == newest
        assert saved > 1_500_000 and project.verify() == []


def test_summaries_agree_with_the_full_records(tmp_path, task):
    with Project.create(tmp_path / "s.cuagent", task) as project:
        project.add_candidates(make_records(300, seed=9))
        final = ("measured", "wrong", "crashed")
        full = list(project.candidates(status=final))
        light = project.summaries(status=final, limit=1000)
        assert [s.id for s in light] == [r.id for r in full] and len(light) > 10
        for s, r in zip(light, full):
            assert (s.branch_id, s.parent_id, s.origin, s.schedule, s.status, s.reason, s.reward) == \
                (r.branch_id, r.parent_id, r.origin, r.schedule, r.status, r.reason, r.reward)
            assert s.median_ms == (r.median_ms if r.status == "measured" else s.median_ms)
            assert s.speedup_eager == (r.measurement or {}).get("speedup_eager")
        page = project.summaries(status=final, since_id=light[4].id, limit=3)
        assert [s.id for s in page] == [s.id for s in light[5:8]]
