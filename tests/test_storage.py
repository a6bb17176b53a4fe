"""Optuna storage as ranknas opens it: SQLite in WAL mode, errors a person can act on."""

import os
import shutil
import uuid
from collections.abc import Iterator

import optuna
import pytest
from optuna.exceptions import StorageInternalError, UpdateFinishedTrialError
from sqlalchemy import event, text

from nas.storage import load_study, open_storage, params_in_one_transaction, set_user_attrs
from search_space.errors import RanknasError

POSTGRES = os.environ.get("RANKNAS_TEST_POSTGRES_URL")


def counted_writes(engine) -> list[int]:
    """A list that gets an item at each commit of a transaction that wrote (a read also
    commits its session)."""
    writes: list[int] = []

    def before(connection, cursor, statement, *args) -> None:
        if statement.lstrip()[:6].upper() in ("INSERT", "UPDATE", "DELETE"):
            connection.info["wrote"] = True

    def commit(connection) -> None:
        if connection.info.pop("wrote", False):
            writes.append(1)

    event.listen(engine, "begin", lambda connection: connection.info.pop("wrote", None))
    event.listen(engine, "before_cursor_execute", before)
    event.listen(engine, "commit", commit)
    return writes


def test_sqlite_storage_uses_the_write_ahead_log(tmp_path):
    storage = open_storage(f"sqlite:///{tmp_path}/deep/studies.db")
    with storage.engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert connection.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
    study_id = storage.create_new_study([], "s")
    reopened = open_storage(f"sqlite:///{tmp_path}/deep/studies.db")
    assert reopened.get_study_id_from_name("s") == study_id


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path) -> str:
    """A database of each kind the batched writes are for (PostgreSQL where CI gives one)."""
    if request.param == "postgresql" and not POSTGRES:
        pytest.skip("RANKNAS_TEST_POSTGRES_URL is not set (.ci/run sets it)")
    return POSTGRES if request.param == "postgresql" else f"sqlite:///{tmp_path}/studies.db"


@pytest.fixture
def study(url) -> Iterator[optuna.Study]:
    """A new study there (TPE past its random start after 2 trials), deleted after."""
    sampler = optuna.samplers.TPESampler(seed=0, n_startup_trials=2, multivariate=True)
    name = f"batched-{uuid.uuid4().hex[:8]}"
    study = optuna.create_study(study_name=name, storage=open_storage(url), sampler=sampler)
    yield study
    optuna.delete_study(study_name=name, storage=study._storage)


def test_a_trial_s_attributes_are_written_in_one_transaction(url, study):
    trial = study.ask()
    trial.set_user_attr("digest", "old")
    commits = counted_writes(study._storage._backend.engine)
    attrs = {"digest": "new", "val_ne": 0.93, "curves": {"ne": [[1, 0.9]]}, "skip": True}
    set_user_attrs(trial, attrs)
    assert len(commits) == 1
    assert trial.user_attrs == attrs  # what the trial object reads, as with set_user_attr
    stored = optuna.load_study(study_name=study.study_name, storage=open_storage(url)).trials[0]
    assert stored.user_attrs == attrs  # the upsert replaced "old"
    study.tell(trial, 0.9)
    with pytest.raises(UpdateFinishedTrialError, match="trial 0 is COMPLETE"):
        set_user_attrs(trial, {"late": 1})


def test_a_failed_batched_write_is_reported_as_optuna_reports_its_own(tmp_path):
    """The CLI tells a StorageInternalError as one line ("is its disk full..."); a raw
    SQLAlchemy error would print a traceback."""
    storage = open_storage(f"sqlite:///{tmp_path}/gone/studies.db")
    trial = optuna.create_study(storage=storage).ask()
    shutil.rmtree(tmp_path / "gone")
    storage.engine.dispose()  # no pooled connection to the deleted file
    with pytest.raises(StorageInternalError, match="a write to the study's storage failed"):
        set_user_attrs(trial, {"digest": "x"})
    with pytest.raises(StorageInternalError), params_in_one_transaction(trial):
        trial.suggest_int("width", 8, 64)


def test_a_trial_s_parameters_are_written_in_one_transaction(url, study):
    def draw(trial: optuna.Trial) -> dict:
        return {"op": trial.suggest_categorical("op", ["mlp", "dot", "fm"]),
                "width": trial.suggest_int("width", 8, 64),
                "dim": trial.suggest_categorical("dim", [4, 8, 16])}  # fmt: skip

    inserts: list[int] = []  # executions inserting parameters (many rows count once)
    event.listen(study._storage._backend.engine, "before_cursor_execute",
                 lambda connection, cursor, statement, *args: inserts.append(1)
                 if statement.startswith("INSERT INTO trial_params") else None)  # fmt: skip
    for _ in range(3):  # past the sampler's random start: TPE reads the told trials
        trial = study.ask()
        inserts.clear()
        with params_in_one_transaction(trial):
            drawn = draw(trial)
            assert not inserts, "written before the block ended"
        assert len(inserts) == 1  # one at a time: 3
        assert trial.params == drawn
        study.tell(trial, drawn["width"] / 64)
    stored = optuna.load_study(study_name=study.study_name, storage=open_storage(url)).trials
    assert [t.params for t in stored] == [t.params for t in study.trials]
    assert stored[-1].distributions["op"] == optuna.distributions.CategoricalDistribution(
        ["mlp", "dot", "fm"]
    )


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
    # a password with its own @ and / (its tail showed: "***@ss/w0rd@127.0.0.1")
    torn = "postgresql://postgres:p@ss/w0rd@127.0.0.1:5432/team"
    assert redact(torn) == "postgresql://postgres:***@127.0.0.1:5432/team"
    from sqlalchemy.exc import SQLAlchemyError

    from nas.storage import _unreachable_as_user_error

    hint = r"write @ as %40 and / as %2F"
    with pytest.raises(RanknasError, match=hint) as said, _unreachable_as_user_error(torn):
        raise SQLAlchemyError(f"could not translate host name 'ss' of {torn}")
    assert "w0rd" not in str(said.value)
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


def test_a_missing_study_lists_the_studies_there_but_not_their_baselines_recipe_trials(
    tmp_path,
):
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    for name in ("quickstart", "quickstart.tune.dlrm", "other"):
        optuna.create_study(study_name=name, storage=url)
    with pytest.raises(RanknasError) as raised:
        load_study("nostudy", url)
    assert str(raised.value).endswith("studies there: quickstart, other")


def test_a_missing_study_names_the_nearest_first_and_lists_at_most_ten(tmp_path):
    """A database shared by a team listed every user's study after the error."""
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    for name in [f"team{i:02d}" for i in range(14)] + ["quickstart"]:
        optuna.create_study(study_name=name, storage=url)
    with pytest.raises(RanknasError) as raised:
        load_study("quickstrat", url)
    said = str(raised.value)
    assert "did you mean 'quickstart'? Studies there: quickstart, team00" in said
    assert said.endswith("team08 and 5 more")


def test_another_program_s_database_is_refused_and_left_as_it_was(tmp_path):
    """Given MLflow's database (one server, two databases: an easy slip), Optuna wrote its
    13 tables into it, even for `status`, or met a table of the same name with a traceback."""
    import sqlite3

    path = tmp_path / "mlflow.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE alembic_version (version_num VARCHAR(32))")
        connection.execute("CREATE TABLE experiments (experiment_id INTEGER)")
    url = f"sqlite:///{path}"
    with pytest.raises(RanknasError, match="holds no Optuna studies"):
        load_study("q", url)
    with pytest.raises(RanknasError, match="holds another program's tables"):
        open_storage(url)
    with sqlite3.connect(path) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
    assert tables == {"alembic_version", "experiments"}
