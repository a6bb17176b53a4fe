"""The registered model as MLflow serves it (saved locally, predicted in process, and by
`mlflow models serve`): the README's request as written, and a one-line reason per bad cell."""

from __future__ import annotations

import json
import re
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow.exceptions import MlflowException

from nas.export import export_model
from nas.export.layout import _Columns
from nas.export.registry import save_pyfunc
from search_space.builder import build_model
from search_space.presets import preset
from search_space.schema import CategoricalFeature, DatasetSchema, synthetic_schema

README = Path(__file__).resolve().parents[1] / "README.md"
UNSEEN_ROWS = 20  # the served model's: a request of fewer rows is not warned of
SHOPS = [f"shop-{k}" for k in range(18)]  # c0's training vocabulary


def _served(
    tmp_path: Path, schema: DatasetSchema, fitted: dict, name: str = "dlrm"
) -> mlflow.pyfunc.PyFuncModel:
    """Preset `name` on `schema` exported with `fitted` preprocessing, as MLflow loads it."""
    arch = preset(name, schema)
    result = export_model(arch, build_model(arch, seed=0).state_dict(), {}, tmp_path / "export",
                          schema=schema, preprocessing=fitted)  # fmt: skip
    columns = _Columns.of(arch, schema)
    columns = columns.__class__(columns.dense, columns.features, columns.dataset,
                                frozenset(fitted.get("vocabulary", {})))  # fmt: skip
    save_pyfunc(result, columns, tmp_path / "pyfunc")
    return mlflow.pyfunc.load_model(str(tmp_path / "pyfunc"))


def _readme_request() -> dict:
    """The body of the README's `curl ... /invocations` example."""
    body = re.search(r"/invocations .*?-d \\\s*'(\{.*?\})'", README.read_text(), re.DOTALL)
    assert body, "README.md has no curl example for /invocations"
    return json.loads(body.group(1))


def test_the_readme_request_is_served_as_written(tmp_path):
    """The README's request is for the quickstart's model: the synthetic schema, ids."""
    request = _readme_request()["dataframe_split"]
    schema = synthetic_schema()
    assert request["columns"] == [*schema.dense, *schema.feature_names]
    model = _served(tmp_path, schema, {})
    frame = pd.DataFrame(request["data"], columns=request["columns"])
    probabilities = model.predict(frame)
    assert probabilities.shape == (len(frame),) and 0 < probabilities[0] < 1


def test_a_request_of_no_rows_gets_no_scores(tmp_path):
    """DHEN's attention reshaped no rows into an ambiguous shape (an HTTP 400 with a
    traceback), and the exported module's `prepare_dense([])` was of shape [0]."""
    from nas.export.entry import _import_file

    schema = synthetic_schema()
    columns = [*schema.dense, *schema.feature_names]
    model = _served(tmp_path, schema, {}, "dhen")
    assert model.predict(pd.DataFrame([], columns=columns)).shape == (0,)
    module = _import_file(tmp_path / "export" / "ranknas_model.py")
    dense = module.prepare_dense([], tmp_path / "export")
    assert dense.shape == (0, len(schema.dense))


# c0 mapped through a vocabulary, c1 given as ids
ID_FEATURES = (CategoricalFeature("c0", 20), CategoricalFeature("c1", 5))
ID_SCHEMA = DatasetSchema(dense=("d0",), categorical=ID_FEATURES, name="ids")


def test_each_bad_cell_is_one_line_naming_its_column_row_and_value(tmp_path):
    model = _served(tmp_path, ID_SCHEMA, {"vocabulary": {"c0": SHOPS}})
    frame = pd.DataFrame({"d0": [1.5, "cheap", None, 0.5, 0.5, "inf", 1e300],
                          "c0": ["shop-3", "shop-1", "shop-2", None, "shop-4", "shop-1", "shop-1"],
                          "c1": [1, 2, 3, "shop-3", 7, 1, None]})  # fmt: skip
    with pytest.raises(MlflowException) as raised:
        model.predict(frame)
    assert raised.value.error_code == "INVALID_PARAMETER_VALUE"  # HTTP 400 when served
    # nothing fills a missing d0 in this model: the hint for a text does not offer a blank
    assert raised.value.message.splitlines() == [
        "dense column 'd0', row 1: 'cheap' is not a number; give a number",
        "dense column 'd0', row 5: 'inf' is not a finite number within float32's range "
        "(3.4e38): give one",
        "dense column 'd0', row 6: 1e+300 is not a finite number within float32's range "
        "(3.4e38): give one",
        "dense column 'd0', row 2: missing; this model's training data had no missing d0, so "
        "nothing fills one: give a number",
        "categorical column 'c1', row 3: 'shop-3' is not an id of this model; it was trained "
        "on c1's ids (no vocabulary, no missing value): give a whole number 0..4",
        "categorical column 'c1', row 4: 7 is not an id of this model; it was trained on c1's "
        "ids (no vocabulary, no missing value): give a whole number 0..4",
        "categorical column 'c1', row 6: a missing value (null) is not an id of this model; it "
        "was trained on c1's ids (no vocabulary, no missing value): give a whole number 0..4",
    ]
    with pytest.raises(MlflowException) as raised:  # numbers only: no text to convert
        model.predict(pd.DataFrame({"d0": [-np.inf], "c0": ["shop-1"], "c1": [1]}))
    assert raised.value.message.startswith("dense column 'd0', row 0: -inf is not a finite")
    with pytest.raises(MlflowException, match=r"row 1: a missing value \(null\) is not an id"):
        model.predict(pd.DataFrame({"d0": [0.5, 0.5], "c0": ["shop-1"] * 2, "c1": [1, np.nan]}))
    for flags in ([True, 0.5], [True, False]):  # among numbers, or a column of booleans
        with pytest.raises(MlflowException, match=r"row 0: True is not a number"):
            model.predict(pd.DataFrame({"d0": flags, "c0": ["shop-1"] * 2, "c1": [1, 1]}))
    served = model.unwrap_python_model()  # a network that overflows on finite inputs, as
    network, served.model = served.model, lambda dense, ids: dense[:, 0] * 1e38 - dense[:, 0] * 1e38
    with pytest.raises(MlflowException) as raised:  # the quickstart's did past d0 = 1e7
        model.predict(pd.DataFrame({"d0": [0.5, 3e38], "c0": ["shop-1"] * 2, "c1": [1, 1]}))
    served.model = network
    assert raised.value.message == (
        "row 1: the model's score is not a number: its dense values are far outside the "
        "training data's range (it has no fitted scaling that clips them); give values in that "
        "range")  # fmt: skip
    with pytest.raises(MlflowException) as raised:
        model.predict(frame[["d0", "c1"]])
    assert raised.value.message == "input is missing column(s) c0: send every column of d0, c0, c1"


def test_the_stored_input_example_is_a_typical_row_that_scores(tmp_path):
    """MLflow's `serving_input_example.json` (what a user copies into a request) held a row
    of zeros and blanks: now each dense column's training mean, a count's through log1p
    undone, and each vocabulary's most frequent value; an id column stays at id 0."""
    fitted = {"dense": [{"column": "d0", "log1p": True, "mean": 2.0, "std": 1.0}],
              "vocabulary": {"c0": SHOPS}}  # fmt: skip
    model = _served(tmp_path, ID_SCHEMA, fitted)
    stored = json.loads((tmp_path / "pyfunc" / "serving_input_example.json").read_text())
    split = stored["dataframe_split"]
    row = dict(zip(split["columns"], split["data"][0], strict=True))
    assert row == {"d0": pytest.approx(6.389, abs=1e-3), "c0": "shop-0", "c1": 0}
    frame = pd.DataFrame(split["data"], columns=split["columns"])
    assert 0 < model.predict(frame)[0] < 1


def test_a_request_of_mostly_unseen_values_is_warned_of_in_the_log(tmp_path, caplog):
    """Values not written as training read them (shop codes without their prefix) were
    each scored as out of vocabulary, and nothing said so; a few unseen values are normal."""
    model = _served(tmp_path, ID_SCHEMA, {"vocabulary": {"c0": SHOPS}})
    rows = 30
    frame = pd.DataFrame({"d0": [0.5] * rows, "c0": [str(k % 18) for k in range(rows)],
                          "c1": [1] * rows})  # fmt: skip
    with caplog.at_level("WARNING", logger="ranknas"):
        model.predict(frame)
    assert ("column 'c0': 30 of 30 values in this request were not seen in training (e.g. '0', "
            "training's most frequent: 'shop-0')") in caplog.text  # fmt: skip
    caplog.clear()
    mostly_known = frame.assign(c0=[SHOPS[k % 18] if k % 3 else "new" for k in range(rows)])
    with caplog.at_level("WARNING", logger="ranknas"):
        model.predict(mostly_known)
        model.predict(frame.head(UNSEEN_ROWS - 1))  # too few rows to tell
    assert "not seen in training" not in caplog.text


def test_a_category_pandas_reads_as_missing_is_warned_of_in_the_log(tmp_path, caplog):
    """Training kept "NA" a device's value; `pandas.read_csv` made it NaN, and its rows
    were scored as missing (0.43 where the study's model said 0.99; a user trial)."""
    model = _served(tmp_path, ID_SCHEMA, {"vocabulary": {"c0": [*SHOPS[:17], "NA"]}})
    frame = pd.DataFrame({"d0": [0.5] * 3, "c0": ["shop-1", np.nan, "NA"], "c1": [1] * 3})
    with caplog.at_level("WARNING", logger="ranknas"):
        model.predict(frame)
    assert ("column 'c0': missing values in a request (1 of 3 rows), each scored as missing; "
            "training read 'NA' as a value, which pandas.read_csv reads as missing: read the "
            "file with keep_default_na=False") in caplog.text  # fmt: skip
    caplog.clear()
    with caplog.at_level("WARNING", logger="ranknas"):
        model.predict(frame)  # said once: a server's every request would repeat it
    assert "pandas.read_csv" not in caplog.text
    other = _served(tmp_path / "plain", ID_SCHEMA, {"vocabulary": {"c0": SHOPS}})
    with caplog.at_level("WARNING", logger="ranknas"):
        other.predict(frame)  # no such value in training: a missing value is just that
    assert "pandas.read_csv" not in caplog.text


def test_whole_floats_are_ids_and_null_categories_missing(tmp_path):
    model = _served(tmp_path, ID_SCHEMA, {"vocabulary": {"c0": SHOPS}})
    as_given = pd.DataFrame({"d0": [1.5, 0.5, 2.0], "c0": ["shop-3", "", "shop-4"],
                             "c1": [1, 4, 0]})  # fmt: skip
    # as pandas reads a file with a blank: the ids become floats, the blank a NaN
    as_read = as_given.assign(c0=["shop-3", np.nan, "shop-4"], c1=[1.0, 4.0, 0.0])
    with_none = as_given.assign(c0=["shop-3", None, "shop-4"], c1=["1", "4", "0"])
    expected = model.predict(as_given)
    np.testing.assert_array_equal(model.predict(as_read), expected)
    np.testing.assert_array_equal(model.predict(with_none), expected)


def test_mlflow_models_serve_answers_the_readme_request_and_refuses_bad_rows(tmp_path):
    """`mlflow models serve` itself (a uvicorn server, as a user starts it) on the exported
    model: the README's request as written gets a probability; a bad row gets HTTP 400 with
    one line naming its column, row and value."""
    import os
    import socket
    import subprocess
    import sys
    import time
    import urllib.error
    import urllib.request

    _served(tmp_path, synthetic_schema(), {})
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    bin_dir = str(Path(sys.executable).parent)  # mlflow starts uvicorn from PATH
    env = os.environ | {"PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}
    command = [str(Path(bin_dir) / "mlflow"), "models", "serve", "-m", str(tmp_path / "pyfunc"),
               "--env-manager", "local", "-h", "127.0.0.1", "-p", str(port)]  # fmt: skip
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def post(body: dict) -> tuple[int, dict]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations", json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            return exc.code, json.load(exc)

    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
                break
            except OSError:
                assert server.poll() is None, "mlflow models serve exited"
                time.sleep(1)
        status, answer = post(_readme_request())
        assert status == 200 and 0 < answer["predictions"][0] < 1
        bad = _readme_request()
        bad["dataframe_split"]["data"][0][1] = "abc"
        status, answer = post(bad)
        assert status == 400
        assert "dense column 'd1', row 0: 'abc' is not a number" in answer["message"]
        missing = _readme_request()
        split = missing["dataframe_split"]
        split["columns"], split["data"] = split["columns"][1:], [row[1:] for row in split["data"]]
        status, answer = post(missing)  # told by the model in one line, not by MLflow's schema
        assert (
            status == 400
            and "input is missing column(s) d0: send every column of d0, d1" in (answer["message"])
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
