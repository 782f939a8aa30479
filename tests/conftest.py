import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


# -- the store on both backends (see helpers/pgstore.py) -------------------

import pytest  # noqa: E402


def pytest_generate_tests(metafunc):
    if "store_backend" in metafunc.fixturenames and not metafunc.definition.get_closest_marker("sqlite_only"):
        from helpers.pgstore import BACKENDS

        metafunc.parametrize("store_backend", BACKENDS, indirect=True)


@pytest.fixture(scope="session")
def postgres_server():
    """One real PostgreSQL server for the whole session, started on first use."""
    from bridge.devpostgres import Postgres

    server = Postgres()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def store_backend(request, monkeypatch):
    """``sqlite`` as is, or ``postgresql``: every Store(path) the test makes opens PostgreSQL."""
    backend = getattr(request, "param", "sqlite")
    if backend == "postgresql":
        from helpers.pgstore import on_postgresql

        on_postgresql(monkeypatch, request.getfixturevalue("postgres_server"))
    return backend
