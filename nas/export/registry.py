"""Registration in the MLflow model registry: a models-from-code pyfunc (nothing pickled)
that loads the export's own module."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import math
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from mlflow_server.server import check_reachable
from nas.export.layout import (
    EXPERIMENT,
    ExportResult,
    _Columns,
    requirements,
)
from nas.export.model_card import registry_description
from nas.trial_record import PREPROCESSING_FILE
from search_space.architecture import Analysis
from search_space.errors import RanknasError

# ---------------------------------------------------------------------- MLflow registry


_PYFUNC_CODE = '''
"""MLflow entry point ("models from code") of a model exported by ranknas.

The artifact "export" is the export directory: `ranknas_model.py` rebuilds the network with
torch alone and loads `model.safetensors`. Nothing is unpickled.
"""

import importlib.util
import logging
import sys
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import torch
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE


class ExportedRankingModel(mlflow.pyfunc.PythonModel):
    """predict(DataFrame with the dense and categorical columns, raw values or ids, a list
    per row for a multi-valued column) -> click probabilities. Every bad cell is one line of
    a bad-request error (HTTP 400 when served) naming its column, row and value and what the
    column takes; nothing is scored then."""

    def load_context(self, context) -> None:
        directory = Path(context.artifacts["export"])
        name = f"ranknas_model_{abs(hash(str(directory)))}"
        spec = importlib.util.spec_from_file_location(name, directory / "ranknas_model.py")
        self.module = importlib.util.module_from_spec(spec)
        sys.modules[name] = self.module
        spec.loader.exec_module(self.module)
        self.model = self.module.load(directory)
        self.directory = directory
        # each column's training values that pandas.read_csv reads as missing, and the
        # columns warned of (`_warn_read_as_missing`): found once, not on every request
        self.read_as_missing = _read_as_missing(self.module, self.module._preprocessing(directory))
        self.warned = set()

    def predict(self, context, model_input: pd.DataFrame, params=None) -> np.ndarray:
        m = self.module
        missing = [c for c in (*m.DENSE_COLUMNS, *m.FEATURES) if c not in model_input.columns]
        if missing:
            every = ", ".join((*m.DENSE_COLUMNS, *m.FEATURES))
            raise _bad_request(f"input is missing column(s) {', '.join(missing)}: send every "
                               f"column of {every}")  # fmt: skip
        fitted = m._preprocessing(self.directory)
        problems = []
        dense = _dense(model_input, m, bool(fitted.get("dense")), problems)
        raw = [_categorical(model_input[f].tolist(), f, n, fitted, problems, m)
               for f, n in zip(m.FEATURES, m.NUM_EMBEDDINGS, strict=True)]  # fmt: skip
        if problems:
            raise _bad_request(problems)
        try:
            ids = m.encode_ids(raw, m.FEATURES, self.directory)
        except ValueError as exc:  # a malformed multi-valued cell: names its feature and row
            raise _bad_request(str(exc)) from None
        _warn_unseen(ids, raw, m, fitted)
        _warn_read_as_missing(raw, m, self.read_as_missing, self.warned)
        with torch.no_grad():
            logits = self.model(m.prepare_dense(dense, self.directory), ids)
        scores = torch.sigmoid(logits).numpy()
        if not np.isfinite(scores).all():  # finite inputs the network overflows on
            scaled = "" if fitted.get("dense") else " (it has no fitted scaling that clips them)"
            raise _bad_request([
                f"row {row}: the model's score is not a number: its dense values are far "
                f"outside the training data's range{scaled}; give values in that range"
                for row in np.flatnonzero(~np.isfinite(scores))
            ])  # fmt: skip
        return scores


MAX_LINES = 50  # of a bad request's error: a request of 5,000 bad rows gets 50, and a count
UNSEEN_SHARE, UNSEEN_ROWS = 0.5, 20  # a column mostly unseen in a request of 20 rows or more


def _warn_unseen(ids, raw: list, m, fitted: dict) -> None:
    """Warn in the server's log of a column whose values in a request of `UNSEEN_ROWS` rows
    or more were mostly not seen in training: each is scored as out of vocabulary, without
    a word (a zip code sent as 2134 where training read "02134")."""
    vocabulary, lists = fitted.get("vocabulary", {}), fitted.get("multi_valued", {})
    for k, (feature, values) in enumerate(zip(m.FEATURES, raw, strict=True)):
        if feature not in vocabulary or feature in lists:
            continue
        column = ids[:, k] if isinstance(ids, torch.Tensor) else ids[k]
        given, unseen = column != 0, column == 1
        if int(given.sum()) >= UNSEEN_ROWS and int(unseen.sum()) > UNSEEN_SHARE * int(given.sum()):
            example = values[int(torch.nonzero(unseen)[0])]
            common = vocabulary[feature][0] if vocabulary[feature] else None
            logging.getLogger("ranknas").warning(
                "column %r: %d of %d values in this request were not seen in training (e.g. "
                "%r, training's most frequent: %r), each scored as out of vocabulary: send them "
                "as the training file wrote them",
                feature,
                int(unseen.sum()),
                int(given.sum()),
                example,
                common,
            )


# the texts pandas.read_csv reads as missing (its default na_values)
READ_AS_MISSING = {"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan",
                   "1.#IND", "1.#QNAN", "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a",
                   "nan", "null"}  # fmt: skip


def _read_as_missing(m, fitted: dict) -> dict:
    """Each single-valued vocabulary column's training values that pandas.read_csv reads
    as missing ("NA"), where it has any."""
    vocabulary, lists = fitted.get("vocabulary", {}), fitted.get("multi_valued", {})
    found = {f: [v for v in vocabulary[f] if isinstance(v, str) and v in READ_AS_MISSING]
             for f in m.FEATURES if f in vocabulary and f not in lists}  # fmt: skip
    return {f: words for f, words in found.items() if words}


def _warn_read_as_missing(raw: list, m, read_as_missing: dict, warned: set) -> None:
    """Warn in the server's log, once a column (`warned`), of missing values in a column
    whose training values hold a text that pandas.read_csv reads as missing
    (`read_as_missing`): training kept "NA" a value, and rows read by pandas were scored as
    missing, far from the study's."""
    for feature, values in zip(m.FEATURES, raw, strict=True):
        if feature not in read_as_missing or feature in warned:
            continue
        missing = int(pd.isna(pd.Series(values, dtype=object)).sum())  # None, NaN, pd.NA
        if missing:
            warned.add(feature)
            logging.getLogger("ranknas").warning(
                "column %r: missing values in a request (%d of %d rows), each scored as "
                "missing; training read %r as a value, which pandas.read_csv reads as missing: "
                "read the file with keep_default_na=False, or send the text (said once)",
                feature,
                missing,
                len(values),
                read_as_missing[feature][0],
            )


def _bad_request(problems: str | list) -> MlflowException:
    lines = [problems] if isinstance(problems, str) else problems
    if len(lines) > MAX_LINES:
        more = len(lines) - MAX_LINES
        lines = [*lines[:MAX_LINES], f"... and {more} more like these ({len(lines)} in all): "
                 "fix those above, then send the request again"]  # fmt: skip
    return MlflowException("\\n".join(lines), error_code=INVALID_PARAMETER_VALUE)


def _dense(frame: pd.DataFrame, m, fills: bool, problems: list) -> torch.Tensor:
    """The dense columns as a row-major float32 tensor in torch's own (aligned) memory (a
    column-major or unaligned input would make vectorized kernels round differently in the
    last bit); texts as training read them (`dense_value`: "N/A", "null"... missing), a
    missing value only where the fitted transforms fill it (`fills`)."""
    block = frame[list(m.DENSE_COLUMNS)]
    if not all(pd.api.types.is_numeric_dtype(t) and not pd.api.types.is_bool_dtype(t)
               for t in block.dtypes):  # fmt: skip
        block = block.copy()
        for name in m.DENSE_COLUMNS:
            block[name] = [_number(value, name, row, m, fills, problems)
                           for row, value in enumerate(block[name].tolist())]  # fmt: skip
    with np.errstate(over="ignore"):  # a value beyond float32's range is told below
        values = np.ascontiguousarray(block.to_numpy(np.float32, na_value=np.nan))
    for row, column in zip(*np.nonzero(np.isinf(values)), strict=True):
        name = m.DENSE_COLUMNS[column]
        given = frame[name].iloc[row]
        given = given.item() if isinstance(given, np.generic) else given  # -inf, not np.float64
        problems.append(f"dense column {name!r}, row {row}: {given!r} is not a finite number "
                        "within float32's range (3.4e38): give one")  # fmt: skip
    if not fills:
        for row, column in zip(*np.nonzero(np.isnan(values)), strict=True):
            name = m.DENSE_COLUMNS[column]
            problems.append(f"dense column {name!r}, row {row}: missing; this model's "
                            f"training data had no missing {name}, so nothing fills one: give "
                            "a number")  # fmt: skip
    return torch.tensor(values)


def _number(value, name: str, row: int, m, fills: bool, problems: list) -> float:
    try:
        return m.dense_value(value)
    except (TypeError, ValueError):
        missing = " (blank, N/A or null for missing)" if fills else ""
        problems.append(f"dense column {name!r}, row {row}: {value!r} is not a number; give a "
                        f"number{missing}")  # fmt: skip
        return 0.0


def _categorical(values: list, feature: str, rows: int, fitted: dict, problems: list, m) -> list:
    """A categorical column's values for `encode_ids`: as they are where the model maps raw
    values (a vocabulary or hashing: a null is missing, an unseen value out of vocabulary;
    a multi-valued cell must split into items); else they must be ids, whole numbers in
    [0, rows) (3.0 or "3" is 3)."""
    if feature in fitted.get("hex_ids", {}):  # a Criteo file's: hex texts (`m.hex_id`)
        for row, cell in enumerate(values):
            try:
                m.hex_id(cell)
            except ValueError as exc:
                problems.append(f"categorical column {feature!r}, row {row}: {exc}")
        return values
    if feature in fitted.get("vocabulary", {}) or feature in fitted.get("hashing", {}):
        lists = fitted.get("multi_valued", {}).get(feature)
        for row, cell in enumerate(values):
            if lists is None and m.several_values(cell):  # else scored as one unseen value
                problems.append(f"categorical column {feature!r}, row {row}: {cell!r} is a "
                                "collection, not one value; this column takes one value a "
                                "row")  # fmt: skip
            elif lists is not None:
                try:
                    m.split_cell(cell, lists["separator"])
                except ValueError as exc:
                    problems.append(f"categorical column {feature!r}, row {row}: {cell!r} "
                                    f"holds {exc}: give its items")  # fmt: skip
        return values
    ids = []
    for row, value in enumerate(values):
        number = m.whole_number(value)
        if number is None or not 0 <= number < rows:
            null = value is None or (isinstance(value, float) and np.isnan(value))
            given = "a missing value (null)" if null else repr(value)
            problems.append(f"categorical column {feature!r}, row {row}: {given} is not an id "
                            f"of this model; it was trained on {feature}'s ids (no vocabulary, "
                            f"no missing value): give a whole number 0..{rows - 1}")  # fmt: skip
            number = 0
        ids.append(number)
    return ids


mlflow.models.set_model(ExportedRankingModel())
'''


def _register(
    result: ExportResult,
    analysis: Analysis,
    metrics: Mapping[str, Any],
    columns: _Columns,
    name: str,
    tracking_uri: str | None,
    alias: str | None,
    source_run_id: str | None = None,
) -> ExportResult:
    """Register the export as a version of `name` (a pyfunc model from code) and point the
    alias at it (None: no alias); the same export registered again (architecture, weights
    and preprocessing alike) reuses its version. The model card is the version's
    description, brought up to date when a version is reused."""
    import mlflow
    from mlflow.exceptions import MlflowException

    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise RanknasError("registering a model needs an MLflow tracking URI")
    check_reachable(uri)
    fingerprint = _fingerprint(result, columns)
    try:
        client = mlflow.MlflowClient(uri)
        version = _registered(client, name, fingerprint)
        reused = version is not None
        if version is None:
            version = _log_model_version(result, analysis.flops, metrics, columns, name, uri,
                                         source_run_id)  # fmt: skip
            client.set_model_version_tag(name, version, "ranknas_digest", result.digest)
            client.set_model_version_tag(name, version, FINGERPRINT_TAG, fingerprint)
        # the card of now, also for a version the same model had: after `reevaluate` its
        # description kept the single runs' verdict
        description = registry_description(result.model_card.read_text())
        client.update_model_version(name, version, description)
        if alias is not None:
            client.set_registered_model_alias(name, alias, version)
    except MlflowException as exc:
        raise RanknasError(f"registering {name!r} at {uri} failed: {exc.message}") from exc
    model_uri = f"models:/{name}@{alias}" if alias else f"models:/{name}/{version}"
    return replace(result, model_name=name, model_version=version, alias=alias,
                   model_uri=model_uri, reused_version=reused)  # fmt: skip


FINGERPRINT_TAG = "ranknas_fingerprint"


def _fingerprint(result: ExportResult, columns: _Columns) -> str:
    """What makes two exports the same served model: architecture, weights, preprocessing,
    and how MLflow serves them (the entry point and the input signature)."""
    digest = hashlib.sha256(result.digest.encode())
    for path in (result.weights, result.out_dir / PREPROCESSING_FILE):
        if path.exists():
            digest.update(path.read_bytes())
    digest.update(_PYFUNC_CODE.encode())
    digest.update(json.dumps(_signature(columns).to_dict(), sort_keys=True).encode())
    return digest.hexdigest()[:24]


# what MLflow prints itself (not through its logger) as it registers a version
MLFLOW_REGISTRY_LINES = ("Successfully registered model", "Registered model ", "Created version")


class _WithoutLines(io.TextIOBase):
    """`stream` less the lines that start with `prefixes`; every other line passes at once."""

    def __init__(self, stream: Any, prefixes: tuple[str, ...]) -> None:
        self.stream, self.prefixes, self.pending = stream, prefixes, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            if not line.startswith(self.prefixes):
                self.stream.write(line + "\n")
        return len(text)

    def flush(self) -> None:
        if self.pending and not self.pending.startswith(self.prefixes):
            self.stream.write(self.pending)  # a progress bar's line, drawn in place
        self.pending = ""
        self.stream.flush()


@contextlib.contextmanager
def _registry_lines_hidden() -> Iterator[None]:
    """MLflow's own registration lines, hidden as its info lines are, unless -v (`ranknas
    export` says what it registered); the rest of what it writes passes through."""
    if logging.getLogger("mlflow").getEffectiveLevel() <= logging.INFO:
        yield
        return
    filtered = _WithoutLines(sys.stderr, MLFLOW_REGISTRY_LINES)
    try:
        with contextlib.redirect_stderr(filtered):
            yield
    finally:
        filtered.flush()


def _registered(client: Any, name: str, fingerprint: str) -> str | None:
    """The version of `name` already holding this export, if any."""
    from mlflow.exceptions import MlflowException

    try:
        versions = client.search_model_versions(f"name = {_quote(name)}")
    except MlflowException:
        return None  # not registered yet
    same = [v.version for v in versions if v.tags.get(FINGERPRINT_TAG) == fingerprint]
    return min(same, key=int) if same else None


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _log_model_version(
    result: ExportResult,
    flops: int,
    metrics: Mapping[str, Any],
    columns: _Columns,
    name: str,
    uri: str,
    source_run_id: str | None = None,
) -> str:
    """Log the model in `source_run_id` (the trial's run) or a new run of the EXPERIMENT
    experiment; the new version of `name`."""
    import mlflow

    # log_model and start_run read the global tracking URI: set it for this call only
    from mlflow.tracking._tracking_service.utils import _use_tracking_uri

    client = mlflow.MlflowClient(uri)
    run = client.get_run(source_run_id).info if source_run_id else None
    with (
        tempfile.TemporaryDirectory() as tmp,
        _use_tracking_uri(uri),
        mlflow.start_run(run_id=source_run_id)
        if source_run_id
        else mlflow.start_run(experiment_id=_export_experiment(client), run_name=f"export {name}"),
    ):
        if not source_run_id:  # a trial's run has its params and metrics already
            mlflow.log_params({"digest": result.digest, "flops": flops})
            mlflow.log_metrics(_numeric(metrics))
        with _registry_lines_hidden():
            info = mlflow.pyfunc.log_model(name="model", registered_model_name=name,
                                           **_pyfunc_model(result, columns, Path(tmp)))  # fmt: skip
    if source_run_id:  # leaving start_run ended the trial's run now: give back its own end
        client.set_terminated(source_run_id, status=run.status, end_time=run.end_time)
    return str(info.registered_model_version)


def _export_experiment(client) -> str:
    """The EXPERIMENT experiment's id, made where missing: only for a model that has no
    trial run to log into (an empty experiment was left on every server otherwise)."""
    experiment = client.get_experiment_by_name(EXPERIMENT)
    return experiment.experiment_id if experiment else client.create_experiment(EXPERIMENT)


def save_pyfunc(result: ExportResult, columns: _Columns, path: Path) -> None:
    """The model as `--register` logs it, saved in the MLflow model directory `path` (what
    `mlflow.pyfunc.load_model` and `mlflow models serve -m` take), no server needed."""
    import mlflow

    with tempfile.TemporaryDirectory() as tmp:
        mlflow.pyfunc.save_model(str(path), **_pyfunc_model(result, columns, Path(tmp)))


def _pyfunc_model(result: ExportResult, columns: _Columns, tmp: Path) -> dict[str, Any]:
    """What MLflow stores of an export: the entry point (written in `tmp`), the export
    directory, signature, input example and requirements."""
    entry_point = tmp / "ranknas_pyfunc.py"
    entry_point.write_text(_PYFUNC_CODE.lstrip())
    return {"python_model": str(entry_point), "artifacts": {"export": str(result.out_dir)},
            "signature": _signature(columns),
            "input_example": _input_example(columns, result.out_dir / PREPROCESSING_FILE),
            "pip_requirements": requirements()}  # fmt: skip


def _numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {
        name: float(value)
        for name, value in metrics.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    }


def _signature(columns: _Columns) -> Any:
    """Input: every column as values of any type, as the user's file or JSON holds them (the
    model converts numbers, maps texts and numbers alike through a vocabulary, and names
    each cell it cannot take; typed columns refused an int64 `ad_id`, an int64 `age`, a text
    id with a 400 that named no row, and ids that pandas read as floats); a raw
    multi-valued cell as its file's text ("a|b") or as a list; output: probabilities."""
    import numpy as np
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema, TensorSpec
    from mlflow.types.schema import AnyType

    # not required, so that a missing column reaches `predict`, which names it in one line
    # (MLflow's own check put it after two printouts of the request and the schema)
    inputs = [ColSpec(AnyType(), c, required=False) for c in (*columns.dense, *columns.features)]
    outputs = Schema([TensorSpec(np.dtype(np.float32), (-1,), "probability")])
    return ModelSignature(inputs=Schema(inputs), outputs=outputs)


def _input_example(columns: _Columns, preprocessing: Path) -> Any:
    """A typical row, as MLflow stores it (`serving_input_example.json`, which a user copies
    into a request) and predicts it to check the model: each dense column at its training
    mean (before standardization; a count's, through log1p, undone), each categorical at its
    most frequent training value (an id column, whose values the model takes as given, at
    id 0). An all-blank row was stored, which told nothing of what a column holds."""
    import pandas as pd

    fitted = json.loads(preprocessing.read_text()) if preprocessing.exists() else {}
    transforms = fitted.get("dense") or [{"log1p": False, "mean": 0.0}] * len(columns.dense)
    dense = {c: [_typical_number(t)] for c, t in zip(columns.dense, transforms, strict=True)}
    vocabulary = fitted.get("vocabulary") or {}
    ids = {}
    for f in columns.features:
        value = (vocabulary.get(f) or [""])[0] if f in columns.raw_features else 0
        ids[f] = [[value] if f in columns.list_features else value]
    return pd.DataFrame(dense | ids)


def _typical_number(transform: Mapping[str, Any]) -> float:
    mean = float(transform["mean"])
    return float(f"{math.expm1(mean) if transform['log1p'] else mean:.4g}")
