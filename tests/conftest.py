"""Shared pytest setup: tests that use the ``lab`` fixture are marked ``lab`` automatically."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "lab" in getattr(item, "fixturenames", ()) and item.get_closest_marker("lab") is None:
            item.add_marker(pytest.mark.lab)


@pytest.fixture(scope="session")
def users():
    """Two real throwaway users, ``victim`` and ``attacker`` (tests/uids.py), removed at the end of the session."""
    from tests import uids

    why = uids.unavailable()
    if why:
        pytest.skip(why)
    yield from uids.created(("victim", "attacker"))


@pytest.fixture
def scratch(users):
    """A folder the victim owns and every user may enter, removed after the test."""
    from tests import uids

    yield from uids.scratch(users["victim"])
