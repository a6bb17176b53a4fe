"""Optuna storage as ranknas opens it: SQLite in WAL mode, errors a person can act on."""

import pytest
from sqlalchemy import text

from nas.storage import open_storage
from search_space.errors import RanknasError


def test_sqlite_storage_uses_the_write_ahead_log(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path}/deep/studies.db")
    with storage.engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
    study_id = storage.create_new_study([], "s")
    reopened = open_storage(f"sqlite:///{tmp_path}/deep/studies.db")
    assert reopened.get_study_id_from_name("s") == study_id


def test_an_unusable_url_is_a_clear_error():
    with pytest.raises(RanknasError, match="storage 'nosuchdb://x': cannot open it"):
        open_storage("nosuchdb://x")


def test_passwords_never_show(capsys):
    from nas.cli import main
    from nas.storage import redact

    assert redact("postgresql://ranker:s3cret@db:5432/studies") == (
        "postgresql://ranker:***@db:5432/studies"
    )
    assert redact("sqlite:///ranknas-data/studies.db") == "sqlite:///ranknas-data/studies.db"
    assert redact("https://bob:pw@mlflow.example:443") == "https://bob:***@mlflow.example:443"
    url = "postgresql://ranker:s3cret@127.0.0.1:1/studies"  # nothing listens on port 1
    assert main(["status", "some-study", "--storage", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "s3cret" not in err and "ranker:***@" in err


@pytest.mark.parametrize(
    ("storage", "expected"),
    [
        ("studies.db", "(ArgumentError: Could not parse SQLAlchemy URL from given URL string); "
         "a SQLite file is given as sqlite:///studies.db"),
        ("sqlite:///{tmp}/text.db", "(DatabaseError: file is not a database); check the URL"),
        ("sqlite:///{tmp}", "(OperationalError: unable to open database file); check the URL"),
    ],
    ids=["a file name, not a URL", "a text file", "a directory"],
)  # fmt: skip
def test_a_storage_that_cannot_be_opened_is_one_line_without_sqlalchemy_s_text(
    storage, expected, tmp_path, capsys
):
    """The error carried SQLAlchemy's SQL text and web link, and no hint of what to do."""
    from nas.cli import main

    (tmp_path / "text.db").write_text("not a database\n")
    assert main(["status", "s", "--storage", storage.format(tmp=tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: storage") and expected in err, err
    assert len(err.strip().splitlines()) == 1 and "sqlalche.me" not in err and "[SQL" not in err
