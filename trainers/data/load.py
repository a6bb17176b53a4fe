"""One entry point for every data set: `load_dataset(spec, schema_path, **options)`."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from search_space.errors import RanknasError
from trainers.data.compressed import format_suffix
from trainers.data.criteo import load_criteo
from trainers.data.dataset import TabularData
from trainers.data.parquet_parts import parquet_parts
from trainers.data.synthetic import config_from_options, generate_synthetic
from trainers.data.tabular import TABULAR_SUFFIXES, load_tabular

SPEC_HELP = (
    "use 'synthetic', 'criteo:PATH', or the path of a .csv/.tsv (plain or .gz, .bz2, .xz) or "
    ".parquet file, or of a directory of Parquet files"
)


def load_dataset(
    spec: str = "synthetic", schema_path: str | Path | None = None, **options: Any
) -> TabularData:
    """Load a data set by spec.

    - `synthetic`: the built-in synthetic set; options are `SyntheticConfig` fields
      (default 200,000 rows, seed 0);
    - `criteo:PATH`: a Criteo TSV; options are `load_criteo`'s keywords;
    - `PATH.csv` / `PATH.parquet` / a directory of Parquet files (Hive partitions
      included): your logs, described by the YAML at `schema_path`; options are
      `load_tabular`'s keywords.
    """
    if spec == "synthetic":
        if schema_path is not None:
            raise RanknasError("the synthetic data set has a built-in schema; drop schema_path")
        return generate_synthetic(config_from_options(**options))
    if spec.startswith("criteo:"):
        path = spec.removeprefix("criteo:")
        if not path:
            raise RanknasError(f"data set {spec!r}: give the file, as criteo:PATH")
        return _call(load_criteo, spec, options, path)
    if format_suffix(spec) in TABULAR_SUFFIXES or Path(spec).is_dir():
        if Path(spec).is_dir():
            parquet_parts(Path(spec))  # one without any said before the schema is asked for
        if schema_path is None:
            raise RanknasError(
                f"{spec}: a CSV/Parquet data set needs a schema file (label, dense, "
                "categorical columns): pass --schema FILE (data.schema in a study); "
                "`ranknas data schema FILE --label COLUMN` infers one"
            )
        return _call(load_tabular, spec, options, spec, schema_path)
    raise RanknasError(f"data set {spec!r}: unknown kind; {SPEC_HELP}")


def _call(
    loader: Callable[..., TabularData], spec: str, options: dict[str, Any], *args: Any
) -> TabularData:
    allowed = [
        p.name
        for p in inspect.signature(loader).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise RanknasError(f"data set {spec!r}: unknown option(s) {unknown}; allowed: {allowed}")
    return loader(*args, **options)
