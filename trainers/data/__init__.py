"""Data sets behind one `DatasetSchema`: synthetic (with a known optimum), Criteo TSV,
your own CSV/Parquet logs; one in-memory form (`TabularData`), splits and a batch loader.
"""

from trainers.data.criteo import load_criteo
from trainers.data.dataset import Batch, BatchLoader, TabularData
from trainers.data.load import load_dataset
from trainers.data.report import BadRowLimits, BadRowReport
from trainers.data.synthetic import (
    BayesMetrics,
    SyntheticConfig,
    bayes_metrics,
    generate_synthetic,
    write_synthetic,
)
from trainers.data.tabular import load_tabular, read_tabular_schema

__all__ = [
    "BadRowLimits",
    "BadRowReport",
    "Batch",
    "BatchLoader",
    "BayesMetrics",
    "SyntheticConfig",
    "TabularData",
    "bayes_metrics",
    "generate_synthetic",
    "load_criteo",
    "load_dataset",
    "load_tabular",
    "read_tabular_schema",
    "write_synthetic",
]
