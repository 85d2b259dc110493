"""One contract, two metadata backends: every test here runs on SQLite and on a real
PostgreSQL (tests/support/pgserver.py), as the storage contract runs on local disk and S3.

Two ``Catalog``s on one database, each on its own connection, stand for two nodes.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cluster.nodes import Membership, NodeError
from core.errors import Conflict
from metadata.catalog import Catalog, FileEntry, StaleFiles
from metadata.connect import open_database
from metadata.db import Database
from metadata.postgres import Postgres
from metadata.sqlite import Sqlite
from tenancy.sessions import Sessions
from tenancy.tenants import Tenancy

Opener = Callable[[], Database]


@pytest.fixture(params=["sqlite", "postgresql"])
def connect(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens a new connection to one fresh metadata database (closed after the test)."""
    url = "sqlite:" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    opened: list[Database] = []

    def open_one() -> Database:
        db = open_database(url, tmp_path)
        opened.append(db)
        return db

    yield open_one
    for db in opened:
        db.close()


def entry(key: str, *, project: str = "p1", box: str = "b", date: str = "2026-12-01",
          ts: tuple[int, int] = (1000, 2000), ids: tuple[int, int] = (1, 10),
          size: int = 100) -> FileEntry:
    return FileEntry(key=key, project_id=project, box=box, date=date, min_ts=ts[0],
                     max_ts=ts[1], min_id=ids[0], max_id=ids[1], rows=ids[1] - ids[0] + 1,
                     bytes=size)


def test_files_move_pending_live_retired(connect: Opener) -> None:
    cat = Catalog(connect(), "n1")
    a, b = entry("a", ts=(0, 100), ids=(1, 5)), entry("b", ts=(200, 300), ids=(6, 9))
    cat.add_pending([a, b])
    assert cat.live_files("p1", 0, 10**12) == []
    assert sorted(cat.files_in_state("pending")) == ["a", "b"]
    cat.publish(["a", "b"])
    assert [f.key for f in cat.live_files("p1", 0, 10**12)] == ["b", "a"]  # newest first
    assert [f.key for f in cat.live_files("p1", 150, 250)] == ["b"]
    assert cat.live_files("p1", 0, 10**12, box="other") == []
    assert [f.key for f in cat.live_files_after("p1", 5)] == ["b"]
    assert cat.live_files("p1", 0, 100) == [a]  # every field comes back as stored
    assert cat.count_live() == 2 and cat.count_live("p1") == 2 and cat.count_live("p2") == 0
    assert cat.max_id() == 9
    cat.add_pending([entry("ab", ts=(0, 300), ids=(1, 9))])
    cat.publish(["ab"], retire=["a", "b"])
    assert [f.key for f in cat.live_files("p1", 0, 10**12)] == ["ab"]
    assert sorted(cat.files_in_state("retired")) == ["a", "b"]
    assert cat.files_in_state("retired", older_than=time.time() - 60) == []
    cat.forget(["a", "b"])
    assert cat.files_in_state("retired") == []


def test_small_files_are_small_in_bytes_and_in_rows(connect: Opener) -> None:
    cat = Catalog(connect(), "n1")
    files = [entry("few", ids=(1, 10)), entry("many", ids=(11, 1010)),
             entry("big", ids=(1011, 1020), size=10_000), entry("other", box="c")]
    cat.add_pending(files)
    cat.publish([f.key for f in files])
    assert [f.key for f in cat.partition_files("p1", "b", "2026-12-01", 1000, 100)] == ["few"]
    assert len(cat.partition_files("p1", "b", "2026-12-01", 10**6, 10**6)) == 3
    assert cat.small_partitions(2, 1000, 100) == []
    assert cat.small_partitions(2, 1000, 10**6) == [("p1", "b", "2026-12-01")]
    assert sorted(cat.small_partitions(1, 1000, 100)) == [("p1", "b", "2026-12-01"),
                                                          ("p1", "c", "2026-12-01")]


def test_large_integers_survive(connect: Opener) -> None:
    """Ids and timestamps are 64-bit (BIGINT on PostgreSQL)."""
    cat = Catalog(connect(), "n1")
    big = entry("big", ts=(2**41, 2**42), ids=(2**60, 2**62), size=2**40)
    cat.add_pending([big])
    cat.publish(["big"])
    assert cat.live_files("p1", 0, 2**62) == [big]


def test_a_publish_that_would_retire_a_file_not_live_changes_nothing(connect: Opener) -> None:
    cat = Catalog(connect(), "n1")
    cat.add_pending([entry("a"), entry("b")])
    cat.publish(["a", "b"])
    cat.add_pending([entry("m1"), entry("m2")])
    cat.publish(["m1"], retire=["a", "b"], flushed_lsn=3)
    with pytest.raises(StaleFiles):
        cat.publish(["m2"], retire=["a", "b"], flushed_lsn=9)
    # Nothing of the failed publish happened: m2 is still pending, the position did not move.
    assert cat.files_in_state("pending") == ["m2"]
    assert [f.key for f in cat.live_files("p1", 0, 10**12)] == ["m1"]
    assert cat.flushed_lsn() == 3
    with pytest.raises(StaleFiles):  # publishing a file twice
        cat.publish(["m1"])


def test_each_node_has_its_own_wal_position(connect: Opener) -> None:
    one, two = Catalog(connect(), "n1"), Catalog(connect(), "n2")
    assert one.flushed_lsn() == two.flushed_lsn() == 0
    one.publish([], flushed_lsn=10, flushed_projects={"p1": 10, "p2": 14})
    two.publish([], flushed_lsn=3)
    assert (one.flushed_lsn(), two.flushed_lsn()) == (10, 3)
    assert one.flushed_projects() == {"p2": 14} and two.flushed_projects() == {}
    one.publish([], flushed_lsn=7)  # never backwards
    assert one.flushed_lsn() == 10
    one.publish([], flushed_lsn=12, flushed_projects={"p1": 12})
    assert one.flushed_projects() == {"p2": 14}
    one.publish([], flushed_lsn=20)  # past every project's: nothing more to keep
    assert one.flushed_projects() == {}


def test_a_node_cleans_up_only_its_own_pending_files(connect: Opener) -> None:
    one, two = Catalog(connect(), "n1"), Catalog(connect(), "n2")
    one.add_pending([entry("a1")])
    two.add_pending([entry("b1")])
    assert one.files_in_state("pending", own=True) == ["a1"]
    assert two.files_in_state("pending", own=True) == ["b1"]
    assert sorted(one.files_in_state("pending")) == ["a1", "b1"]


def test_leases_go_to_one_node_at_a_time(connect: Opener) -> None:
    one, two = Catalog(connect(), "n1"), Catalog(connect(), "n2")
    assert one.try_lease("compact:x", 60)
    assert not two.try_lease("compact:x", 60)
    assert one.try_lease("compact:x", 60)  # renewed by its holder
    two.release("compact:x")  # not its lease: nothing happens
    assert not two.try_lease("compact:x", 60)
    one.release("compact:x")
    assert two.try_lease("compact:x", 0.2)
    assert not one.try_lease("compact:x", 60)
    time.sleep(0.3)  # expired: anyone may take it
    assert one.try_lease("compact:x", 60)


def test_concurrent_leases_have_one_winner(connect: Opener) -> None:
    cats = [Catalog(connect(), f"n{i}") for i in range(4)]
    for round_ in range(20):
        won: list[str] = []
        barrier = threading.Barrier(len(cats))

        def take(cat: Catalog, name: str = f"job{round_}", barrier: threading.Barrier = barrier,
                 won: list[str] = won) -> None:
            barrier.wait()
            if cat.try_lease(name, 60):
                won.append(cat.node_id)

        threads = [threading.Thread(target=take, args=(c,)) for c in cats]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(won) == 1, won


def test_concurrent_publishes_retiring_the_same_files_have_one_winner(connect: Opener) -> None:
    cats = [Catalog(connect(), f"n{i}") for i in range(3)]
    for round_ in range(10):
        olds = [f"r{round_}-{i}" for i in range(4)]
        cats[0].add_pending([entry(k) for k in olds])
        cats[0].publish(olds)
        outcomes: list[str] = []
        barrier = threading.Barrier(len(cats))

        def merge(cat: Catalog, olds: list[str] = olds, round_: int = round_,
                  barrier: threading.Barrier = barrier, outcomes: list[str] = outcomes) -> None:
            new = f"m{round_}-{cat.node_id}"
            cat.add_pending([entry(new)])
            barrier.wait()
            try:
                cat.publish([new], retire=olds)
                outcomes.append(new)
            except StaleFiles:
                outcomes.append("lost")

        threads = [threading.Thread(target=merge, args=(c,)) for c in cats]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        winners = [o for o in outcomes if o != "lost"]
        assert len(winners) == 1, outcomes
        live = {f.key for f in cats[0].live_files("p1", 0, 10**12)}
        assert winners[0] in live and not live & set(olds)


def test_projects_get_distinct_numbers_when_made_at_once(connect: Opener) -> None:
    dbs = [connect() for _ in range(4)]
    tenancies = [Tenancy(db) for db in dbs]
    tenant = tenancies[0].ensure_tenant("acme")
    made: list[int] = []
    conflicts: list[str] = []
    barrier = threading.Barrier(len(tenancies))

    def create(tenancy: Tenancy, n: int) -> None:
        barrier.wait()
        for i in range(5):
            made.append(tenancy.create_project(tenant, f"p{n}-{i}", []).sentry_id)
        try:
            tenancy.create_project(tenant, "same", [])
        except Conflict:
            conflicts.append("same")

    threads = [threading.Thread(target=create, args=(t, n)) for n, t in enumerate(tenancies)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(conflicts) == len(tenancies) - 1  # one made it, the others were told
    projects = Tenancy(dbs[0]).list_projects(tenant)
    assert len(projects) == 21 and len(set(made)) == 20
    assert len({p.sentry_id for p in projects}) == 21


def test_keys_and_sessions(connect: Opener) -> None:
    one, two = Tenancy(connect()), Tenancy(connect())
    key, made = one.keys.create(one.ensure_tenant("acme"), "ci")
    assert two.keys.authenticate(key) == one.keys.authenticate(key) == made  # another node
    assert two.keys.authenticate(key + "x") is None
    sessions_one, sessions_two = Sessions(one.db), Sessions(two.db)
    token, session = sessions_one.create(made, 60)
    found = sessions_two.lookup(token)
    assert found is not None and found.tenant_name == "acme" and found.csrf == session.csrf
    sessions_two.revoke(token)
    assert sessions_one.lookup(token) is None
    token, _ = sessions_one.create(made, 0)
    assert sessions_two.lookup(token) is None  # expired


def test_node_ids_are_exclusive_and_numbered(connect: Opener, tmp_path: Path) -> None:
    db = connect()
    first = Membership(db, "node-a")
    assert first.join() == 1
    second = Membership(connect(), "node-b")
    assert second.join() == 2
    if isinstance(db, Postgres):
        with pytest.raises(NodeError, match="in use by a live node"):
            Membership(connect(), "node-a").join()
        first.leave()  # its connection gone (as when its process dies): the id is free
    again = Membership(connect(), "node-a")
    assert again.join() == 1  # the same number as before
    assert again.check()
    for member in (first, second, again):
        member.leave()


def test_the_schema_is_made_once_by_nodes_starting_together(pg_url: str) -> None:
    code = ("import sys; from metadata.postgres import Postgres; "
            "Postgres(sys.argv[1]).close()")
    procs = [subprocess.Popen([sys.executable, "-c", code, pg_url]) for _ in range(6)]
    assert [p.wait(60) for p in procs] == [0] * 6
    db = Postgres(pg_url)
    try:
        assert db.execute("SELECT count(*) FROM schema_version").fetchone()[0] == 1
    finally:
        db.close()


def test_a_catalog_from_before_cluster_mode_is_claimed_by_its_node(tmp_path: Path) -> None:
    """Version 5 kept one WAL position and no node per file: the node that opens it takes
    both, so its WAL is not replayed again and its unfinished files are its own."""
    import sqlite3

    from metadata import ddl as dbmod

    path = tmp_path / "meta.sqlite"
    con = sqlite3.connect(path, isolation_level=None)
    con.executescript("BEGIN;" + "".join(dbmod._MIGRATIONS[:5]) + "PRAGMA user_version=5; "
                      "UPDATE wal_state SET flushed_lsn = 42; "
                      "INSERT INTO files VALUES ('k', 'p', 'b', 'd', 0, 1, 1, 2, 2, 10, "
                      "'pending', 0, 2); COMMIT;")
    con.close()
    cat = Catalog(Sqlite(path), "laptop")
    cat.claim()
    assert cat.flushed_lsn() == 42
    assert cat.files_in_state("pending", own=True) == ["k"]


def test_the_dev_key_is_made_once_for_a_cluster(pg_url: str, tmp_path: Path) -> None:
    """Nodes starting together on an empty catalog: one makes the dev tenant's key, and
    every node's data directory gets that key."""
    code = ("import sys; from boxtrail.cli import bootstrap_dev_key; "
            "from core.config import load; "
            "bootstrap_dev_key(load({'BOXTRAIL_CATALOG_URL': sys.argv[1], "
            "'BOXTRAIL_DATA_DIR': sys.argv[2]}))")
    dirs = [tmp_path / f"node{i}" for i in range(4)]
    procs = [subprocess.Popen([sys.executable, "-c", code, pg_url, str(d)]) for d in dirs]
    assert [p.wait(60) for p in procs] == [0] * 4
    keys = {(d / "dev-api-key").read_text().strip() for d in dirs}
    assert len(keys) == 1
    db = Postgres(pg_url)
    try:
        assert Tenancy(db).keys.authenticate(keys.pop()) is not None
        assert db.execute("SELECT count(*) FROM api_keys").fetchone()[0] == 1
    finally:
        db.close()


def test_an_unreachable_postgres_is_a_clear_503(pg_server: object) -> None:
    from metadata.db import MetadataUnavailable
    from tests.support.pgserver import free_port

    with pytest.raises(MetadataUnavailable) as caught:
        Postgres(f"postgresql://postgres@127.0.0.1:{free_port()}/x")
    assert caught.value.status_code == 503 and caught.value.headers == {"Retry-After": "5"}


def test_statements_fail_clearly_while_postgres_is_down_and_reconnect_after(
        tmp_path: Path) -> None:
    from metadata.db import MetadataUnavailable
    from tests.support.pgserver import PgServer

    with PgServer() as pg:
        url = pg.new_database()
        cat = Catalog(Postgres(url), "n1")
        cat.add_pending([entry("a")])
        pg.stop()
        with pytest.raises(MetadataUnavailable):
            cat.publish(["a"])
        with pytest.raises(MetadataUnavailable):
            cat.flushed_lsn()
        pg.start()
        time.sleep(Postgres.RETRY_AFTER_S)  # after a failed connect, calls fail fast a while
        cat.publish(["a"])  # the same object, reconnected
        assert [f.key for f in cat.live_files("p1", 0, 10**12)] == ["a"]
        cat.db.close()

