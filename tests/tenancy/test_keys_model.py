"""API keys and ingest keys on two "nodes" sharing one catalog, against a model: a
Hypothesis state machine makes, revokes and expires API keys and adds, disables, enables and
deletes ingest keys through either node, lets the other read the change feed (or not yet),
and checks every key on both nodes.

Once a node has read the feed, it agrees with the model: a revoked or expired key is
refused, a live one is taken with its scopes, and a disabled or deleted ingest key is
unknown while an enabled one names its project. The node that made a change agrees at
once, without the feed. The feed's rows are also handed over out of order and twice (as
PostgreSQL can commit them, and as the look-back reads them again): the nodes still agree,
and a counting listener sees each change once.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from metadata.sqlite import open_db
from tenancy.changes import Changes
from tenancy.keys import SCOPES
from tenancy.tenants import Tenancy


class TwoNodes(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(self._tmp.mktemp("keys-model"))
        self.dbs = [open_db(self.dir / "meta.sqlite") for _ in range(2)]
        self.nodes = [Tenancy(db) for db in self.dbs]
        self.feeds = [Changes(db, node) for db, node in zip(self.dbs, self.nodes, strict=True)]
        self.tenant = self.nodes[0].ensure_tenant("t")
        self.project = self.nodes[0].create_project(self.tenant, "p", [])
        self.api: dict[str, dict[str, Any]] = {}  # secret -> {id, scopes, live}
        self.ingest = {self.project.ingest_key: True}  # key -> enabled (absent: deleted)
        self.gone: set[str] = set()  # ingest keys deleted
        self.synced = [True, True]  # has the node read every change so far?
        self.clock = 0.0

    _tmp: pytest.TempPathFactory

    def _changed_by(self, node: int) -> None:
        """The node that made a change holds it at once; the other, once it reads the feed
        (and the maker is no more synced than it was)."""
        self.synced[1 - node] = False

    @rule(node=st.integers(0, 1), scopes=st.sets(st.sampled_from(SCOPES), min_size=1),
          expiring=st.booleans())
    def make_api_key(self, node: int, scopes: set[str], expiring: bool) -> None:
        expires = time.time() + 3600 if not expiring else time.time() + 0.05
        secret, key = self.nodes[node].keys.create(self.tenant, "k", scopes, expires)
        self.api[secret] = {"id": key.id, "scopes": frozenset(scopes), "live": True,
                            "expires": expires}

    @precondition(lambda self: any(k["live"] for k in self.api.values()))
    @rule(node=st.integers(0, 1), data=st.data())
    def revoke_api_key(self, node: int, data: st.DataObject) -> None:
        secret = data.draw(st.sampled_from(sorted(s for s, k in self.api.items() if k["live"])))
        digest = self.nodes[node].keys.revoke(self.tenant, self.api[secret]["id"])
        self.nodes[node].keys.forget(digest)  # as the route does, before it answers
        self.api[secret]["live"] = False
        self._changed_by(node)

    @rule(node=st.integers(0, 1))
    def add_ingest_key(self, node: int) -> None:
        key = self.nodes[node].add_ingest_key(self.project, "", None)
        self.ingest[key.key] = True
        self._changed_by(node)

    @precondition(lambda self: bool(self.ingest))
    @rule(node=st.integers(0, 1), data=st.data(), action=st.sampled_from(
        ["disable", "enable", "delete"]))
    def change_ingest_key(self, node: int, data: st.DataObject, action: str) -> None:
        key = data.draw(st.sampled_from(sorted(self.ingest)))
        if action == "delete":
            self.nodes[node].delete_ingest_key(self.project, key)
            del self.ingest[key]
            self.gone.add(key)
        else:
            self.nodes[node].change_ingest_key(self.project, key, enabled=action == "enable")
            self.ingest[key] = action == "enable"
        self._changed_by(node)

    @rule(node=st.integers(0, 1), shuffled=st.booleans())
    def read_the_feed(self, node: int, shuffled: bool) -> None:
        feed = self.feeds[node]
        rows = feed._read()
        if shuffled:  # out of order, and some twice
            rows = rows + rows[: len(rows) // 2]
            random.Random(len(rows)).shuffle(rows)
        feed.apply(rows)
        refresher = self.nodes[node]._refresher
        if refresher is not None:
            refresher.join(5)
        self.synced[node] = True

    @invariant()
    def synced_nodes_agree_with_the_model(self) -> None:
        now = time.time()
        for node, synced in zip(self.nodes, self.synced, strict=True):
            if not synced:
                continue
            for secret, model in self.api.items():
                found = node.keys.authenticate(secret)
                if model["live"] and model["expires"] > now + 0.01:
                    assert found is not None and found.scopes == model["scopes"]
                elif not model["live"] or model["expires"] <= now:
                    assert found is None, "a revoked or expired key was taken"
            for key, enabled in self.ingest.items():
                project = node.project_by_ingest_key(key)
                assert (project is not None and project.id == self.project.id) == enabled
            assert all(node.project_by_ingest_key(k) is None for k in self.gone)

    def teardown(self) -> None:
        for node in self.nodes:
            if node._refresher is not None:
                node._refresher.join(5)
        for db in self.dbs:
            db.close()


@pytest.mark.parametrize("seed", [0])
def test_keys_on_two_nodes_follow_the_model(seed: int,
                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    TwoNodes._tmp = tmp_path_factory
    machine = TwoNodes.TestCase
    machine.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
    machine().runTest()


def test_the_feed_applies_each_change_once_whatever_the_order(tmp_path: Path) -> None:
    """Rows read again by the look-back, or a later number committed first: once each."""
    db = open_db(tmp_path / "meta.sqlite")
    feed = Changes(db, Tenancy(db))
    seen: list[str] = []
    feed.listeners = {"x": seen.append}
    feed.apply([(3, "x", "c"), (1, "x", "a")])
    feed.apply([(1, "x", "a"), (2, "x", "b"), (3, "x", "c")])  # 2 committed after 3
    feed.apply([(2, "x", "b"), (4, "y", "ignored"), (5, "x", "e")])
    assert seen == ["c", "a", "b", "e"] and feed._last == 5
    db.close()
