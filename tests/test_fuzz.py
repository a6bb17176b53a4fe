"""A property-based fuzzer of the CLI's inputs (issue 39): study YAMLs, schemas,
architecture JSONs, tables files and small CSV/Parquet files, valid and broken, run through
`nas.cli.main` in process. The contract: exit 0 with a result, or exit 2 with one `error:`
line; never a traceback, never an exception out of `main`; a value outside a field's
documented range (its pydantic bounds, a block parameter's range) is refused, naming it.

Nothing here trains: study YAMLs go through `status` (which loads the config, then finds no
study in an empty storage: a config it accepts ends in "no study") and `space sample`;
architectures through `arch show`; tables through `shard plan` without `--measure`.

Profiles: the tests below run the `quick` profile (500 examples in all, the same ones each
run, in `make test`); the same targets marked slow run `HYPOTHESIS_PROFILE` (default
`long`: 12,500 random examples in all): `pytest -m slow tests/test_fuzz.py`. Every failure
the fuzzer found is a named case in test_bad_inputs.py ("found by the fuzzer").
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import tempfile
from collections.abc import Callable
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import annotated_types
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from cost_models.sharding.methods import HEURISTICS
from nas.cli import main
from nas.config import StudyConfig
from search_space.blocks import DHEN_MODULES, OPS
from search_space.params import Param
from search_space.presets import PRESETS
from search_space.space_configs import (
    AGGREGATIONS,
    DAG_OPS,
    AroundConfig,
    DagConfig,
    DhenConfig,
    WukongConfig,
)
from search_space.spaces import SPACES

QUICK_EXAMPLES = 100  # per target: five targets, 500 examples in all
LONG_EXAMPLES = 2_500  # per target: 12,500 in all
_COMMON = {
    "deadline": None,
    "database": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}
settings.register_profile("quick", max_examples=QUICK_EXAMPLES, derandomize=True, **_COMMON)
settings.register_profile("long", max_examples=LONG_EXAMPLES, **_COMMON)

# the line of a refusal: ours ("error: ..."), or argparse's ("ranknas shard plan: error: ...")
ERROR_LINE = re.compile(r"^(error: |ranknas[\w -]*: error: )")
NOT_STARTED = "run `ranknas search CONFIG` first"  # `status` on a config it accepted


# ---------------------------------------------------------------------- the contract


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str


def run_cli(args: list[str]) -> Outcome:
    """`ranknas ARGS` in process; an exception out of `main` fails the test as it is."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exc:  # argparse's refusals
            code = exc.code
    return Outcome(code, out.getvalue(), err.getvalue())


def check_contract(result: Outcome) -> None:
    """Exit 0 with a result, or exit 2 with exactly one error line; no traceback."""
    shown = f"exit {result.code}\nstdout:\n{result.out}\nstderr:\n{result.err}"
    assert "Traceback" not in result.out + result.err, shown
    assert result.code in (0, 2), shown
    if result.code == 0:
        assert result.out.strip(), "exit 0 without a result\n" + shown
    else:
        errors = [line for line in result.err.splitlines() if ERROR_LINE.match(line)]
        assert len(errors) == 1, shown


def check_refused(result: Outcome, *names: str) -> None:
    """Exit 2, its error naming each of `names` (the field, the value)."""
    check_contract(result)
    shown = f"exit {result.code}\nstdout:\n{result.out}\nstderr:\n{result.err}"
    assert result.code == 2 and NOT_STARTED not in result.err, "accepted:\n" + shown
    for name in names:
        assert name in result.err, f"{name!r} not named\n" + shown


@dataclass(frozen=True)
class Case:
    """A generated input: the file's content, and what it must give."""

    content: Any  # a mapping or list written as YAML/JSON; bytes or str written as they are
    refused: tuple[str, ...] | None  # names the refusal must carry; None: either outcome
    why: str = "valid"
    base: Any = None  # the content before it was broken, where that matters

    def write(self, path: Path) -> Path:
        if isinstance(self.content, bytes):
            path.write_bytes(self.content)
        elif isinstance(self.content, str):
            path.write_text(self.content)
        elif path.suffix == ".json":
            path.write_text(json.dumps(self.content))
        else:
            path.write_text(yaml.safe_dump(self.content, sort_keys=False))
        return path


def in_tmp(check: Callable[[Path, Any], None]) -> Callable[[Any], None]:
    """`check(tmp, case)` in a fresh directory (Hypothesis runs one test many times)."""

    def run(case: Any) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            check(Path(tmp), case)

    return run


# ---------------------------------------------------------------------- broken values

# a value of another type, or garbage, for any field
keys = st.text(max_size=5) | st.integers()  # YAML's keys may be numbers
garbage = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=6,
)
# a prefix no field has, or a number (YAML's keys may be numbers)
unknown_keys = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=3, max_size=12).map(
    lambda s: f"x_{s}"
) | st.integers(-5, 10**6)


@dataclass(frozen=True)
class Bounds:
    """A number field's documented range."""

    kind: type  # int or float
    low: float | None = None
    low_open: bool = False
    high: float | None = None
    high_open: bool = False

    def outside(self) -> st.SearchStrategy[float | int]:
        """Values outside the range: below, above, and (floats) not finite."""
        options = []
        if self.low is not None:
            top = self.low if self.low_open else self.low - (1 if self.kind is int else 1e-9)
            options.append(self._numbers(max_value=top))
        if self.high is not None:
            bottom = self.high if self.high_open else self.high + (1 if self.kind is int else 1e-9)
            options.append(self._numbers(min_value=bottom))
        if self.kind is float:
            options.append(st.sampled_from([math.nan, math.inf, -math.inf]))
        return st.one_of(options)

    def _numbers(self, **bound: float) -> st.SearchStrategy[float | int]:
        if self.kind is int:
            return st.integers(**{k: int(v) for k, v in bound.items()})
        return st.floats(allow_nan=False, allow_infinity=False, **bound)


def bounds_of(field: Any) -> Bounds | None:
    """A pydantic field's bounds, if it is a number with some."""
    kinds = {t for t in (get_args(field.annotation) or (field.annotation,)) if t in (int, float)}
    if not kinds:
        return None
    kind = float if float in kinds else int
    found: dict[str, Any] = {}
    for rule in field.metadata:
        if isinstance(rule, annotated_types.Ge):
            found |= {"low": rule.ge}
        elif isinstance(rule, annotated_types.Gt):
            found |= {"low": rule.gt, "low_open": True}
        elif isinstance(rule, annotated_types.Le):
            found |= {"high": rule.le}
        elif isinstance(rule, annotated_types.Lt):
            found |= {"high": rule.lt, "high_open": True}
    if not found and kind is int:
        return None
    return Bounds(kind, **found)


def ranged_fields(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> dict:
    """Every bounded number field of `model` and its sections: {path: Bounds}."""
    fields = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            fields |= ranged_fields(annotation, (*prefix, key))
        elif (bounds := bounds_of(field)) is not None:
            fields[(*prefix, key)] = bounds
    return fields


STUDY_RANGES = ranged_fields(StudyConfig)
SPACE_RANGES = {
    c.model_fields["type"].default: ranged_fields(c)
    for c in (DagConfig, WukongConfig, DhenConfig, AroundConfig)
}
# the block parameter each searched size of a space becomes (its documented range)
SPACE_CHOICES: dict[str, dict[str, Param]] = {
    "dag": {"widths": OPS["mlp"].PARAMS["widths"], "counts": OPS["efc"].PARAMS["num_out"]},
    "wukong": {name: OPS["wukong"].PARAMS[name] for name in ("num_fm", "num_lc", "rank")}
    | {"fmb_width": OPS["wukong"].PARAMS["fmb_widths"], "top_width": OPS["mlp"].PARAMS["widths"]},
    "dhen": {"hidden": OPS["dhen"].PARAMS["hidden"], "bottom_widths": OPS["mlp"].PARAMS["widths"]},
}


# ---------------------------------------------------------------------- study YAMLs


def _sizes(high: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, high), min_size=1, max_size=3, unique=True)


SPACE_STRATEGIES = {
    "dag": st.fixed_dictionaries(
        {"type": st.just("dag")},
        optional={
            "num_blocks": st.integers(1, 6),
            "ops": st.lists(st.sampled_from(DAG_OPS), min_size=1, max_size=4, unique=True),
            "widths": _sizes(4096),
            "counts": _sizes(64),
            "max_inputs": st.integers(1, 3),
            "embedding_dims": _sizes(64),
        },
    ),
    "wukong": st.fixed_dictionaries(
        {"type": st.just("wukong")},
        optional={
            "max_layers": st.integers(1, 4),
            "num_fm": _sizes(32),
            "num_lc": _sizes(32),
            "rank": _sizes(32),
            "max_fmb_depth": st.integers(1, 3),
            "fmb_width": _sizes(256),
            "top_width": _sizes(256),
        },
    ),
    "dhen": st.fixed_dictionaries(
        {"type": st.just("dhen")},
        optional={
            "max_layers": st.integers(1, 3),
            "modules": st.lists(st.sampled_from(list(DHEN_MODULES)), min_size=1, unique=True),
            "aggregations": st.lists(st.sampled_from(AGGREGATIONS), min_size=1, unique=True),
            "hidden": _sizes(256),
        },
    ),
    "around": st.fixed_dictionaries(
        {"type": st.just("around"), "base": st.sampled_from(list(PRESETS))},
        optional={"width_multipliers": st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=1)},
    ),
}
assert set(SPACE_STRATEGIES) == set(SPACES)


@st.composite
def valid_studies(draw: st.DrawFn) -> dict[str, Any]:
    """A study config `StudyConfig` must accept (its cross-field rules kept)."""
    space = draw(st.sampled_from(sorted(SPACE_STRATEGIES)).flatmap(SPACE_STRATEGIES.get))
    pruning = draw(st.sampled_from(["none", "median", "hyperband"]))
    cost = "none" if pruning != "none" else draw(st.sampled_from(["none", "mflops", "params"]))
    searchers = ["random", "evolution", "tpe"] + (["nsga2"] if cost != "none" else [])
    return {
        "name": draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,20}", fullmatch=True)),
        "data": {"source": "synthetic", "rows": draw(st.integers(1_000, 10**6))},
        "search_space": space,
        "searcher": {
            "type": draw(st.sampled_from(searchers)),
            "population": draw(st.integers(4, 64)),
        },
        "objectives": {"cost": cost},
        "budget": draw(
            st.fixed_dictionaries(
                {"trials": st.integers(1, 1000)},
                optional={
                    "examples_per_trial": st.integers(1, 10**7),
                    "trial_seconds": st.floats(0.1, 1e5),
                },
            )
        ),
        "training": draw(
            st.fixed_dictionaries(
                {},
                optional={
                    "batch_size": st.integers(1, 4096),
                    "dense_lr": st.floats(1e-6, 1.0),
                    "evals": st.integers(1, 20),
                    "device": st.sampled_from(["auto", "cpu", "cuda", "cuda:1"]),
                },
            )
        ),
        "pruning": {"type": pruning},
        "mlflow": {"tracking_uri": None},
        "seed": draw(st.integers(0, 2**32 - 1)),
    }


def _set(config: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    """A copy of `config` with the value at `path` (sections made where missing)."""
    config = json.loads(json.dumps(config))  # a deep copy
    node = config
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value
    return config


@st.composite
def study_cases(draw: st.DrawFn) -> Case:
    """A valid study YAML, or one broken in one way, with what it must give."""
    config = draw(valid_studies())
    space = config["search_space"]["type"]
    how = draw(
        st.sampled_from(
            ["valid", "range", "choice", "type", "unknown", "missing", "garbage", "text"]
        )
    )
    paths = {("search_space", *p): b for p, b in SPACE_RANGES[space].items()} | STUDY_RANGES
    if how == "range":
        path = draw(st.sampled_from(sorted(paths)))
        value = draw(paths[path].outside())
        return Case(_set(config, path, value), (path[-1],), f"{'.'.join(path)}: {value}")
    if how == "choice" and space in SPACE_CHOICES:
        field = draw(st.sampled_from(sorted(SPACE_CHOICES[space])))
        param = SPACE_CHOICES[space][field]
        bad = draw(Bounds(int, param.low, high=param.high).outside())
        value = [*draw(_sizes(8)), bad]
        return Case(_set(config, ("search_space", field), value), (field,), f"{field}: {value}")
    if how == "type":
        path = draw(st.sampled_from(sorted(paths)))
        value = draw(
            st.text(alphabet="abcxyz", min_size=1)
            | st.lists(st.integers(), min_size=1)
            | st.booleans()
        )
        return Case(_set(config, path, value), (path[-1],), f"{'.'.join(path)}: {value!r}")
    if how == "unknown":
        section = draw(
            st.sampled_from(
                [(), ("data",), ("budget",), ("training",), ("search_space",), ("searcher",)]
            )
        )
        key = draw(unknown_keys)
        return Case(_set(config, (*section, key), 1), (str(key),), f"unknown {key}")
    if how == "missing":
        key = draw(st.sampled_from(["name", "search_space"]))
        return Case({k: v for k, v in config.items() if k != key}, (key,), f"no {key}")
    if how == "garbage":
        section = draw(st.sampled_from(sorted(config)))
        return Case(config | {section: draw(garbage)}, None, f"{section}: garbage")
    if how == "text":
        return Case(draw(st.text(max_size=60) | st.binary(max_size=40)), None, "text")
    return Case(config, ())


@in_tmp
def check_study(tmp: Path, case: Case) -> None:
    content = case.content
    if isinstance(content, dict):  # an empty storage: `status` ends in "no study" if accepted
        content = content | {"storage": f"sqlite:///{tmp / 'none.db'}"}
    path = Case(content, case.refused).write(tmp / "study.yaml")
    status = run_cli(["status", str(path)])
    if case.refused is None:
        check_contract(status)
    elif case.refused:
        check_refused(status, *case.refused)
    else:  # accepted: it samples an architecture of its space, too
        assert status.code == 2 and NOT_STARTED in status.err, status
        sample = run_cli(["space", "sample", str(path), "--json"])
        check_contract(sample)
        assert sample.code == 0 and "architecture" in json.loads(sample.out), sample
    assert not (tmp / "none.db").exists()  # `status` creates nothing


# ---------------------------------------------------------------------- schemas

names = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)


@st.composite
def schema_cases(draw: st.DrawFn) -> Case:
    columns = draw(st.lists(names.filter(lambda n: n != "y"), min_size=1, max_size=8, unique=True))
    cut = draw(st.integers(0, len(columns)))
    categorical = [{"name": c, "cardinality": draw(st.integers(1, 10**6))} for c in columns[cut:]]
    schema: dict[str, Any] = {"label": "y", "dense": columns[:cut], "categorical": categorical}
    how = draw(st.sampled_from(["valid", "range", "type", "unknown", "garbage", "text"]))
    if how == "range" and categorical:
        value = draw(st.integers(max_value=0))
        categorical[0]["cardinality"] = value
        return Case(schema, ("cardinality",), f"cardinality {value}")
    if how == "type":
        key = draw(st.sampled_from(["label", "dense", "categorical"]))
        return Case(schema | {key: draw(garbage)}, None, f"{key}: garbage")
    if how == "unknown":
        key = draw(unknown_keys)
        return Case(schema | {key: 1}, (str(key),), f"unknown {key}")
    if how == "garbage":
        return Case(draw(garbage), None, "garbage")
    if how == "text":
        return Case(draw(st.text(max_size=60)), None, "text")
    return Case(schema, () if 0 < cut < len(columns) else None)  # dlrm reads both kinds


@in_tmp
def check_schema(tmp: Path, case: Case) -> None:
    path = case.write(tmp / "schema.yaml")
    result = run_cli(["arch", "show", "dlrm", "--schema", str(path), "--json"])
    if case.refused:
        check_refused(result, *case.refused)
    else:
        check_contract(result)
    if case.refused == ():
        assert result.code == 0 or "TiB" in result.err, result  # only tables too big


# ---------------------------------------------------------------------- architectures


def _param_value(param: Param) -> st.SearchStrategy[Any]:
    """A value within a block parameter's documented range."""
    low, high = param.low or 0, min(param.high or 64, 64)
    if param.kind == "int":
        value = st.integers(low, high)
    elif param.kind == "int_list":
        value = st.lists(st.integers(max(low, 1), high), min_size=1, max_size=3)
    elif param.kind == "bool":
        value = st.booleans()
    elif param.kind == "choice":
        value = st.sampled_from(param.choices)
    else:
        value = st.lists(st.sampled_from(param.choices), min_size=1, unique=True)
    return st.none() | value if param.optional else value


@st.composite
def architecture_cases(draw: st.DrawFn) -> Case:
    blocks: list[dict[str, Any]] = []
    for i in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(sorted(OPS)))
        sources = ["dense", "sparse", *(b["name"] for b in blocks)]
        params = {
            name: draw(_param_value(p))
            for name, p in OPS[op].PARAMS.items()
            if p.required or draw(st.booleans())
        }
        inputs = draw(st.lists(st.sampled_from(sources), min_size=1, max_size=2, unique=True))
        blocks.append({"name": f"b{i}", "op": op, "inputs": inputs, "params": params})
    arch = {"name": "fuzzed", "embedding": {"dim": draw(st.integers(1, 64))}, "blocks": blocks}
    how = draw(st.sampled_from(["valid", "range", "unknown", "garbage", "text"]))
    ranged = [(b, n, p) for b in blocks for n, p in OPS[b["op"]].PARAMS.items() if p.kind == "int"]
    if how == "range" and ranged:
        block, name, param = draw(st.sampled_from(ranged))
        base = json.loads(json.dumps(arch))  # before the change
        block["params"][name] = value = draw(Bounds(int, param.low, high=param.high).outside())
        return Case(arch, (block["name"], name), f"{block['name']}.{name}: {value}", base)
    if how == "unknown":
        key = draw(unknown_keys)
        return Case(arch | {key: 1}, (str(key),), f"unknown {key}")
    if how == "garbage":
        key = draw(st.sampled_from(["embedding", "blocks", "output", "num_dense"]))
        return Case(arch | {key: draw(garbage)}, None, f"{key}: garbage")
    if how == "text":
        return Case(draw(st.text(max_size=60)), None, "text")
    return Case(arch, None)  # a shape may not fit an op: either outcome


@in_tmp
def check_architecture(tmp: Path, case: Case) -> None:
    path = case.write(tmp / "arch.json")
    result = run_cli(["arch", "show", str(path), "--json"])
    if not case.refused:
        check_contract(result)
        return
    base = Case(case.base, ()).write(tmp / "base.json")
    if run_cli(["arch", "show", str(base), "--json"]).code == 0:
        check_refused(result, *case.refused)
    else:  # refused for another mistake, which its error may name instead
        check_refused(result)


# ---------------------------------------------------------------------- tables files


@st.composite
def table_cases(draw: st.DrawFn) -> Case:
    count = draw(st.integers(1, 12))
    tables = [
        draw(
            st.fixed_dictionaries(
                {
                    "name": st.just(f"t{i}"),
                    "num_embeddings": st.integers(1, 10**7),
                    "embedding_dim": st.integers(1, 128).map(lambda d: 4 * d),
                },
                optional={
                    "pooling_factor": st.floats(0.01, 100),
                    "dtype": st.sampled_from(["fp32", "fp16"]),
                    "zipf_alpha": st.floats(0.01, 3),
                },
            )
        )
        for i in range(count)
    ]
    content: Any = {"tables": tables}
    how = draw(st.sampled_from(["valid", "range", "type", "unknown", "garbage", "text"]))
    refused: tuple[str, ...] | None = ()
    if how == "range":
        key = draw(
            st.sampled_from(["num_embeddings", "embedding_dim", "pooling_factor", "zipf_alpha"])
        )
        bounds = Bounds(int, 1) if key != "pooling_factor" and key != "zipf_alpha" else None
        value = draw(bounds.outside() if bounds else st.sampled_from([0, -1.5, math.inf, math.nan]))
        tables[draw(st.integers(0, count - 1))][key] = value
        refused = (key,)
    elif how == "type":
        key = draw(st.sampled_from(["name", "num_embeddings", "embedding_dim", "dtype"]))
        tables[0][key] = draw(garbage)
        refused = None
    elif how == "unknown":
        key = draw(unknown_keys)
        tables[0][key] = 1
        refused = (str(key),)
    elif how == "garbage":
        content, refused = draw(garbage), None
    elif how == "text":
        content, refused = draw(st.text(max_size=60)), None
    devices = draw(st.integers(1, 64) | st.integers(-3, 0))
    method = draw(st.sampled_from([*HEURISTICS, "rl"]))
    return Case(
        {"file": content, "devices": devices, "method": method},
        refused if devices >= 1 else ("--devices",),
        how,
    )


@in_tmp
def check_tables(tmp: Path, case: Case) -> None:
    path = Case(case.content["file"], None).write(tmp / "tables.yaml")
    args = [
        "shard",
        "plan",
        str(path),
        "--devices",
        str(case.content["devices"]),
        "--method",
        case.content["method"],
        "--model",
        str(tmp / "model"),
        "--json",
    ]
    result = run_cli(args)
    if case.refused:
        check_refused(result, *case.refused)
    else:
        check_contract(result)


# ---------------------------------------------------------------------- CSV and Parquet

cells = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.text(alphabet="abcxyz ,;|\"'", max_size=5),
    st.sampled_from(["", "NA", "true", "false", "2024-01-02", "0", "1"]),
)


@st.composite
def csv_cases(draw: st.DrawFn) -> Case:
    header = ["y", *draw(st.lists(names | st.text(max_size=4), max_size=5))]
    rows = draw(st.integers(0, 40))
    labels = st.sampled_from(["0", "1"]) | cells if draw(st.booleans()) else st.sampled_from("01")
    lines = [",".join(header)]
    for _ in range(rows):
        line = [draw(labels), *(draw(cells) for _ in header[1:])]
        lines.append(",".join(line))
    parquet = draw(st.booleans())
    return Case({"text": "\n".join(lines) + "\n", "parquet": parquet}, None)


@in_tmp
def check_csv(tmp: Path, case: Case) -> None:
    path = tmp / "clicks.csv"
    path.write_text(case.content["text"])
    if case.content["parquet"]:
        import pandas as pd

        try:
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        except Exception:  # a CSV pandas cannot read makes no Parquet file
            return
        path = tmp / "clicks.parquet"
        frame.to_parquet(path)
    result = run_cli(["data", "schema", str(path), "--label", "y"])
    check_contract(result)
    if result.code == 0:
        assert yaml.safe_load(result.out)["label"] == "y", result


# ---------------------------------------------------------------------- the tests

TARGETS = {
    "study YAML": (study_cases(), check_study),
    "schema": (schema_cases(), check_schema),
    "architecture JSON": (architecture_cases(), check_architecture),
    "tables file": (table_cases(), check_tables),
    "CSV or Parquet file": (csv_cases(), check_csv),
}


def _fuzz(target: str, profile: str) -> None:
    """Run `target`'s check on `profile`'s examples; print how many ran (`pytest -s`)."""
    strategy, check = TARGETS[target]
    count = 0

    def counted(case: Any) -> None:
        nonlocal count
        count += 1
        check(case)

    settings(settings.get_profile(profile))(given(strategy)(counted))()
    print(f"\n{target}: {count} examples ({profile} profile)")


@pytest.mark.parametrize("target", list(TARGETS))
def test_fuzz_quick(target: str) -> None:
    """The quick profile, in `make test`."""
    _fuzz(target, "quick")


@pytest.mark.slow
@pytest.mark.parametrize("target", list(TARGETS))
def test_fuzz_long(target: str) -> None:
    """The long profile (or HYPOTHESIS_PROFILE's)."""
    _fuzz(target, os.environ.get("HYPOTHESIS_PROFILE", "long"))
