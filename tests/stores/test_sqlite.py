"""What the SQLite store adds to the contract: the file, its schema, WAL, threads."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from keyturn import (
    KeyturnError,
    NotAKeyDatabase,
    SchemaTooNew,
)
from keyturn.stores import _schema, open_database
from keyturn.stores.sqlite import SQLiteDatabase
from tests.stores.test_contract import make_key


def pragma(db: SQLiteDatabase, name: str) -> object:
    with db.connection() as connection:
        (value,) = connection.execute(f"PRAGMA {name}").fetchone()
    return value


VERSIONS = [(version,) for version in range(1, _schema.SCHEMA_VERSION + 1)]


def test_the_file_and_schema_appear_on_first_use(sqlite_path: Path) -> None:
    """Constructing touches nothing; the first call creates the file at the current version."""
    with SQLiteDatabase(sqlite_path) as db:
        assert not sqlite_path.exists()
        assert db.keys.get_key("NoSuchKey123") is None
        assert sqlite_path.exists()
        assert db.schema_version() == _schema.SCHEMA_VERSION == 8
        assert db.create_schema() == 8  # idempotent
    raw = sqlite3.connect(sqlite_path)
    try:
        assert raw.execute("SELECT version FROM keyturn_schema_version").fetchall() == VERSIONS
    finally:
        raw.close()


def test_wal_busy_timeout_and_foreign_keys(sqlite_path: Path) -> None:
    """Every connection runs in WAL mode, waits for a busy writer, and enforces foreign keys."""
    with SQLiteDatabase(sqlite_path, timeout=2.5) as db:
        assert pragma(db, "journal_mode") == "wal"
        assert pragma(db, "busy_timeout") == 2500
        assert pragma(db, "foreign_keys") == 1


def test_keys_survive_reopening(sqlite_path: Path) -> None:
    """A key written through one database object is read by a new one on the same file."""
    key = make_key()
    with SQLiteDatabase(sqlite_path) as db:
        db.keys.add_key(key)
    with SQLiteDatabase(sqlite_path) as db:
        assert db.keys.get_key(key.key_id) == key


def test_a_newer_schema_is_refused(sqlite_path: Path) -> None:
    """A file written by a newer keyturn is refused with a clear message, not misread."""
    with SQLiteDatabase(sqlite_path) as db:
        db.create_schema()
    raw = sqlite3.connect(sqlite_path)
    raw.execute("INSERT INTO keyturn_schema_version (version) VALUES (99)")
    raw.commit()
    raw.close()
    with SQLiteDatabase(sqlite_path) as db, pytest.raises(SchemaTooNew, match="upgrade keyturn"):
        db.keys.get_key("NoSuchKey123")


@pytest.mark.parametrize("path", ["", ":memory:", "file::memory:?cache=shared"])
def test_in_memory_paths_are_refused(path: str) -> None:
    """SQLite in memory would give each connection its own empty database: refused."""
    with pytest.raises(ValueError, match=r"keyturn\.stores\.memory"):
        SQLiteDatabase(path)


def test_a_closed_database_refuses_calls(sqlite_path: Path) -> None:
    """After close(), calls fail instead of silently reopening the file."""
    db = SQLiteDatabase(sqlite_path)
    db.keys.get_key("NoSuchKey123")
    db.close()
    with pytest.raises(sqlite3.ProgrammingError):
        db.keys.get_key("NoSuchKey123")


def test_threads_share_a_few_connections(sqlite_path: Path) -> None:
    """Eight threads reading at once use at most eight connections and see the same data."""
    key = make_key()
    errors: list[BaseException] = []
    with SQLiteDatabase(sqlite_path) as db:
        db.keys.add_key(key)
        start = threading.Barrier(8)

        def read() -> None:
            try:
                start.wait(5)
                for _ in range(200):
                    assert db.keys.get_key(key.key_id) == key
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=read) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert errors == []
        assert 1 <= db.connections <= 8


def test_two_processes_worth_of_first_use_migrate_once(sqlite_path: Path) -> None:
    """Several database objects creating the same new file at once leave one schema version."""
    databases = [SQLiteDatabase(sqlite_path) for _ in range(4)]
    start = threading.Barrier(4)
    versions: list[int] = []

    def create(db: SQLiteDatabase) -> None:
        start.wait(5)
        versions.append(db.create_schema())

    threads = [threading.Thread(target=create, args=(db,)) for db in databases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for db in databases:
        db.close()
    assert versions == [_schema.SCHEMA_VERSION] * 4
    raw = sqlite3.connect(sqlite_path)
    try:
        assert raw.execute("SELECT version FROM keyturn_schema_version").fetchall() == VERSIONS
    finally:
        raw.close()


def test_open_store_reads_sqlite_urls(tmp_path: Path) -> None:
    """sqlite:/// takes a relative path, sqlite://// an absolute one; other schemes are refused."""
    absolute = open_database(f"sqlite:///{tmp_path}/keys.db")
    relative = open_database("sqlite:///keys.db")
    try:
        assert isinstance(absolute, SQLiteDatabase)
        assert absolute.path == f"{tmp_path}/keys.db"
        assert isinstance(relative, SQLiteDatabase)
        assert relative.path == "keys.db"
    finally:
        absolute.close()
        relative.close()
    with pytest.raises(ValueError, match="unsupported store URL scheme 'mysql'"):
        open_database("mysql://root:hunter2@127.0.0.1/keys")


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:p@ssw0rd@127.0.0.1:5432/keys",
        "postgres://app@ops:hunter@2@127.0.0.1/keys?sslmode=disable",
    ],
)
def test_a_postgresql_url_with_an_unescaped_at_is_refused_before_libpq_reads_it(url: str) -> None:
    """libpq would read the password's ``@`` as the host's start and quote the rest of the
    password in its errors: the URL is refused first, its password hidden, with the fix."""
    with pytest.raises(ValueError, match="percent-encode") as refused:
        open_database(url)
    message = str(refused.value)
    assert "***" in message
    assert "ssw0rd" not in message and "hunter" not in message


@pytest.mark.parametrize("url", ["sqlite://keyturn.sqlite3", "sqlite:keyturn.sqlite3"])
def test_a_sqlite_url_with_too_few_slashes_says_how_many(url: str) -> None:
    """A SQLite URL missing a slash is named as such, not as an unsupported scheme."""
    with pytest.raises(ValueError, match="three slashes before a relative path"):
        open_database(url)


def test_a_version_1_file_is_upgraded_with_its_keys(sqlite_path: Path) -> None:
    """A file made by the first schema gains the leak columns and keeps every key it held."""
    raw = sqlite3.connect(sqlite_path)
    raw.execute(_schema.CREATE_VERSION_TABLE)
    for statement in _schema.MIGRATIONS[0]:
        raw.execute(statement.format(timestamp="TEXT"))
    raw.execute("INSERT INTO keyturn_schema_version (version) VALUES (1)")
    raw.execute(
        "INSERT INTO keyturn_keys VALUES "
        "('OldKeyId1234', 'h', 'rma_\u2026abcd', 'old', 'alice', 'acme', NULL, "
        "'2026-01-01T00:00:00.000000+00:00', '2026-02-01T00:00:00.000000+00:00', NULL, NULL)"
    )
    raw.commit()
    raw.close()
    with SQLiteDatabase(sqlite_path) as db:
        assert db.create_schema() == _schema.SCHEMA_VERSION
        key = db.keys.get_key("OldKeyId1234")
        assert key is not None and key.name == "old" and key.leaked is None
        assert db.keys.leaked_keys() == []


def test_a_file_with_other_tables_is_not_made_a_key_database(sqlite_path: Path) -> None:
    """keyturn never adds its tables to another application's SQLite file."""
    with sqlite3.connect(sqlite_path) as other:
        other.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    other.close()
    with SQLiteDatabase(sqlite_path) as db:
        with pytest.raises(NotAKeyDatabase, match="other tables"):
            db.create_schema()
        with pytest.raises(NotAKeyDatabase):
            db.membership.add_organization("org_a", tenant_id="acme")
    with sqlite3.connect(sqlite_path) as other:
        tables = other.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    other.close()
    assert tables == [("invoices",)]


def test_a_file_that_is_no_database_is_refused(sqlite_path: Path) -> None:
    """A file of other bytes is refused with a typed error, and left as it was."""
    sqlite_path.write_bytes(b"not a database, just some text\n" * 100)
    with SQLiteDatabase(sqlite_path) as db, pytest.raises(NotAKeyDatabase) as caught:
        db.schema_version()
    assert isinstance(caught.value, KeyturnError) and isinstance(caught.value, ValueError)
    assert sqlite_path.read_bytes().startswith(b"not a database")


def test_store_errors_are_typed_and_natural(sqlite_path: Path) -> None:
    """Store errors are KeyturnErrors and the builtin a caller would catch."""
    assert issubclass(SchemaTooNew, KeyturnError) and issubclass(SchemaTooNew, RuntimeError)
    with SQLiteDatabase(sqlite_path) as db:
        db.membership.add_organization("org_a", tenant_id="acme", default=True)
        with pytest.raises(ValueError, match="differently") as conflict:
            db.membership.add_organization("org_a", tenant_id="globex")
        with pytest.raises(LookupError) as unknown:
            db.membership.add_member("alice", "org_nowhere", role="admin")
    assert isinstance(conflict.value, KeyturnError) and isinstance(unknown.value, KeyturnError)
