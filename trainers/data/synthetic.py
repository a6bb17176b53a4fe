"""Synthetic CTR data with a known optimum: the built-in default data set.

Every row's true click probability p is known, so each split has a Bayes floor: no model
can beat, in expectation, the logloss of predicting p. The true logit is

    bias
    + first-order terms: a random weight per id of some categorical features
    + a linear term on the dense features
    + a nonlinearity of dense features: sin(2 x_a) + x_b x_c
    + order 2: FM-style inner products <v_f[id_f], v_g[id_g]> of hidden latent vectors
      over all pairs of some categorical features (what dot-product/FM/DCN models learn)
    + order r >= 3: one rank-`latent_dim` product term sum_k prod_f u_f[id_f, k] over r
      chosen categorical features

Each group of terms is rescaled to the standard deviation given in the config (measured on
a fixed calibration sample, so the function does not depend on `rows`), and the bias is set
so the mean click probability is `base_ctr`. Ids are Zipf-distributed (id 0 most frequent)
over the cardinalities of `search_space.schema.synthetic_schema`, and the per-id parameters
shrink with the id's frequency rank (`signal_rank`), so the signal sits on ids seen often
enough to learn; dense features are standard normal. Every input column and the labels
come from their own seeded stream, so the first m rows of a larger data set equal the m-row
data set with the same config.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import brentq
from scipy.special import expit

from search_space.errors import RanknasError
from search_space.schema import DatasetSchema, synthetic_schema
from trainers.data.dataset import SPLIT_NAMES, TabularData

_CALIBRATION_ROWS = 1 << 16
# Seed streams: (seed, stream, ...) keys a numpy Generator.
_PARAMS, _CALIBRATION, _DATA, _LABELS = range(4)
_EPS = 1e-12


@dataclass(frozen=True)
class SyntheticConfig:
    """Size, seed and shape of the synthetic data set; `*_scale` are logit std devs."""

    rows: int = 200_000
    num_dense: int = 8
    num_sparse: int = 16
    seed: int = 0
    orders: tuple[int, ...] = (2, 3, 4)  # interaction orders present (2 = FM pairs)
    latent_dim: int = 4
    first_order_features: int = 8  # categorical features with a weight per id
    pairwise_features: int = 6  # categorical features whose pairs interact (order 2)
    zipf_exponent: float = 1.3
    signal_rank: float | None = 2.0  # per-id parameters shrink by 1 / (1 + rank / this)
    first_order_scale: float = 0.6
    dense_linear_scale: float = 0.4
    dense_nonlinear_scale: float = 0.4
    pairwise_scale: float = 0.8
    higher_order_scale: float = 0.5  # per order >= 3
    base_ctr: float = 0.15
    # the categorical features' table sizes (then num_sparse is their count); default:
    # `synthetic_schema`'s power-law sizes
    cardinalities: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "orders", tuple(self.orders))
        if self.cardinalities is not None:
            object.__setattr__(self, "cardinalities", tuple(int(c) for c in self.cardinalities))
            object.__setattr__(self, "num_sparse", len(self.cardinalities))
        checks = {
            "rows": self.rows >= 1,
            "num_dense": self.num_dense >= 0,
            "num_sparse": self.num_sparse >= 0 and self.num_sparse + self.num_dense >= 1,
            "latent_dim": self.latent_dim >= 1,
            "first_order_features": 0 <= self.first_order_features <= self.num_sparse,
            "pairwise_features": 0 <= self.pairwise_features <= self.num_sparse
            and (2 not in self.orders or self.pairwise_features >= 2),
            "orders": all(2 <= r <= self.num_sparse for r in self.orders),
            "zipf_exponent": self.zipf_exponent >= 0,
            "signal_rank": self.signal_rank is None or self.signal_rank > 0,
            "base_ctr": 0 < self.base_ctr < 1,
            "cardinalities": self.cardinalities is None or min(self.cardinalities, default=2) >= 2,
        } | {f.name: getattr(self, f.name) >= 0 for f in fields(self) if f.name.endswith("_scale")}
        for name, ok in checks.items():
            if not ok:
                raise RanknasError(
                    f"synthetic data: {name}={getattr(self, name)!r} is not valid (rows >= 1; "
                    f"feature counts and orders within num_sparse={self.num_sparse}; at least 2 "
                    "pairwise_features with order 2; scales >= 0; 0 < base_ctr < 1; "
                    "cardinalities >= 2)"
                )

    @property
    def schema(self) -> DatasetSchema:
        schema = synthetic_schema(self.num_dense, self.num_sparse, self.seed)
        if self.cardinalities is None:
            return schema
        sized = (
            replace(f, cardinality=c)
            for f, c in zip(schema.categorical, self.cardinalities, strict=True)
        )
        return replace(schema, categorical=tuple(sized))


@dataclass(frozen=True)
class BayesMetrics:
    """The Bayes floor of one split: logloss and NE of predicting the true probability.

    `logloss` is the binary cross-entropy of the realized labels against p; `ne` divides it
    by the entropy of the split's base rate (mean label). `expected_logloss` is the mean of
    H(p) (the logloss expected over label draws) and `expected_ne` divides it by H(mean p).
    """

    rows: int
    base_rate: float
    logloss: float
    expected_logloss: float
    ne: float | None  # None on a split of one label: NE is undefined there
    expected_ne: float


def generate_synthetic(config: SyntheticConfig | None = None) -> TabularData:
    """The synthetic data set of `config` (defaults: 200,000 rows, seed 0), with `true_prob`."""
    config = config or SyntheticConfig()
    truth = _Truth(config)
    dense, categorical = truth.inputs(_DATA, config.rows)
    prob = expit(truth.logit(dense, categorical))
    labels = _rng(config.seed, _LABELS).random(config.rows) < prob
    return TabularData(dense, categorical, labels, truth.schema, true_prob=prob)


def bayes_metrics(data: TabularData) -> BayesMetrics:
    """The Bayes-optimal logloss and NE of a synthetic data set (or split)."""
    if data.true_prob is None:
        raise ValueError("bayes_metrics needs data with true_prob (synthetic data)")
    y, p = data.labels.astype(np.float64), np.clip(data.true_prob, _EPS, 1 - _EPS)
    logloss = float(np.mean(-(y * np.log(p) + (1 - y) * np.log1p(-p))))
    expected = float(np.mean(_entropy(p)))
    base_rate = float(y.mean())
    return BayesMetrics(
        rows=len(data),
        base_rate=base_rate,
        logloss=logloss,
        expected_logloss=expected,
        ne=logloss / float(_entropy(base_rate)) if 0 < base_rate < 1 else None,
        expected_ne=expected / float(_entropy(p.mean())),
    )


def write_synthetic(
    out_dir: str | Path,
    config: SyntheticConfig | None = None,
    *,
    file_format: str = "parquet",
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1),
    split_seed: int = 0,
) -> Path:
    """Write `data.parquet` (or `data.csv`), `schema.yaml` and `stats.json` into `out_dir`.

    The data file has the schema's columns plus `true_prob`; the schema gives each
    categorical column its cardinality, so the tabular reader takes the ids as they are.
    `stats.json` holds the config, the split settings, and the Bayes floor per split
    (`TabularData.split(fractions, split_seed)` of the loaded file gives the same splits).
    Returns the data file's path.
    """
    from trainers.data.tabular import write_schema, write_tabular

    if file_format not in ("parquet", "csv"):
        raise RanknasError(
            f"write_synthetic: file_format must be 'parquet' or 'csv', not {file_format!r}"
        )
    config = config or SyntheticConfig()
    data = generate_synthetic(config)
    indices = data.split_indices(fractions, split_seed)  # a split of one label: NE null
    splits = {name: data.take(rows) for name, rows in zip(SPLIT_NAMES, indices, strict=True)}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data_path = write_tabular(data, out / f"data.{file_format}")
    write_schema(data.schema, out / "schema.yaml")
    stats: dict[str, Any] = {
        "config": asdict(config),
        "split": {"fractions": list(fractions), "seed": split_seed},
        "bayes": {"all": asdict(bayes_metrics(data))}
        | {name: asdict(bayes_metrics(part)) for name, part in splits.items()},
    }
    (out / "stats.json").write_text(json.dumps(stats, indent=2) + "\n")
    return data_path


CRITEO_PIECE_ROWS = 1 << 18
_MISSING = 4  # seed stream of the blanks in a Criteo-format file
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def write_synthetic_criteo(
    path: str | Path,
    rows: int,
    seed: int = 0,
    *,
    blank_fraction: float = 0.02,
    piece_rows: int = CRITEO_PIECE_ROWS,
) -> Path:
    """Write `rows` synthetic impressions as a Criteo TSV (`label, I1..I13, C1..C26`), piece
    by piece, so any size fits in memory.

    The truth is the synthetic model's with 13 dense and 26 categorical features: dense x
    becomes the count round(exp(x + 2)) - 1 (log1p of it is about x + 2), an id becomes 8 hex
    digits (a bijection per feature), and `blank_fraction` of each field is left empty.
    """
    import pyarrow.csv as pa_csv

    if not isinstance(rows, int) or rows < 1:
        raise RanknasError(f"synthetic Criteo data: rows must be an integer >= 1 (got {rows!r})")
    truth = _Truth(SyntheticConfig(rows=rows, num_dense=13, num_sparse=26, seed=seed))
    options = pa_csv.WriteOptions(include_header=False, delimiter="\t", quoting_style="none")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as out:
        for part, start in enumerate(range(0, rows, piece_rows)):
            n = min(piece_rows, rows - start)
            dense, ids = truth.inputs(_DATA, n, part=(part,))
            labels = _rng(seed, _LABELS, part).random(n) < expit(truth.logit(dense, ids))
            blanks = _rng(seed, _MISSING, part).random((n, 39)) < blank_fraction
            pa_csv.write_csv(_criteo_table(labels, dense, ids, blanks), out, options)
    return path


def _criteo_table(labels: np.ndarray, dense: np.ndarray, ids: np.ndarray, blanks: np.ndarray):
    import pyarrow as pa

    counts = np.rint(np.exp(np.clip(dense, -10, 10) + 2.0)).astype(np.int64) - 1
    columns = {"label": pa.array(labels.astype(np.int8))}
    for k in range(counts.shape[1]):
        columns[f"I{k + 1}"] = pa.array(counts[:, k], mask=blanks[:, k])
    for k in range(ids.shape[1]):
        salted = ids[:, k].astype(np.uint64) * np.uint64(2654435761) + np.uint64(k * 7919)
        hashed = (salted & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        nibbles = (hashed[:, None] >> np.arange(28, -1, -4, dtype=np.uint32)) & 15
        text = np.ascontiguousarray(_HEX[nibbles]).view("S8").ravel()
        columns[f"C{k + 1}"] = pa.array(text, mask=blanks[:, 13 + k])
    return pa.table(columns)


def _entropy(p: np.ndarray) -> np.ndarray:
    return -(p * np.log(p) + (1 - p) * np.log1p(-p))


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(list(key))


class _Truth:
    """The hidden parameters of the true logit, drawn from the config's seed."""

    def __init__(self, config: SyntheticConfig) -> None:
        self.config = config
        self.schema = config.schema
        cardinalities = [f.cardinality for f in self.schema.categorical]
        rng = _rng(config.seed, _PARAMS)
        self.cdfs = [_zipf_cdf(c, config.zipf_exponent) for c in cardinalities]
        s, d, k = config.num_sparse, config.num_dense, config.latent_dim
        chosen = rng.choice(s, config.first_order_features, replace=False)
        self.first = [(int(f), self._per_id(rng, cardinalities[f])) for f in chosen]
        self.dense_weight = rng.standard_normal(d)
        self.nonlinear = rng.choice(d, 3, replace=d < 3) if d else None
        self.groups: dict[str, list[tuple[int, np.ndarray]]] = {}
        for r in config.orders:
            size = config.pairwise_features if r == 2 else r
            chosen = rng.choice(s, size, replace=False)
            self.groups[f"order{r}"] = [
                (int(f), self._per_id(rng, cardinalities[f], k)) for f in chosen
            ]
        self.factors, self.bias = self._calibrate()

    def _per_id(self, rng: np.random.Generator, cardinality: int, *dims: int) -> np.ndarray:
        """Normal parameters per id, shrunk for rare ids (ids are frequency ranks)."""
        values = rng.standard_normal((cardinality, *dims))
        if self.config.signal_rank is None:
            return values
        shrink = 1 / (1 + np.arange(cardinality) / self.config.signal_rank)
        return values * shrink.reshape(-1, *(1 for _ in dims))

    def inputs(
        self, stream: int, n: int, part: tuple[int, ...] = ()
    ) -> tuple[np.ndarray, np.ndarray]:
        """Dense [n, D] and Zipf ids [n, S], one seeded stream per column group (and `part`,
        for data written piece by piece)."""
        seed = self.config.seed
        dense = _rng(seed, stream, *part, 0).standard_normal((n, self.config.num_dense))
        categorical = np.empty((n, len(self.cdfs)), dtype=np.int64)
        for f, cdf in enumerate(self.cdfs):
            u = _rng(seed, stream, *part, 1, f).random(n)
            categorical[:, f] = np.minimum(np.searchsorted(cdf, u, side="right"), cdf.size - 1)
        return dense.astype(np.float32), categorical

    def logit(self, dense: np.ndarray, categorical: np.ndarray) -> np.ndarray:
        terms = self._terms(dense, categorical)
        return self.bias + sum(self.factors[name] * term for name, term in terms.items())

    def _scale(self, name: str) -> float:
        c = self.config
        if name.startswith("order"):
            return c.pairwise_scale if name == "order2" else c.higher_order_scale
        return getattr(c, f"{name}_scale")

    def _calibrate(self) -> tuple[dict[str, float], float]:
        """Per-term factors giving each term its configured std, and the base-rate bias."""
        terms = self._terms(*self.inputs(_CALIBRATION, _CALIBRATION_ROWS))
        factors = {
            name: self._scale(name) / std if (std := float(term.std())) > 0 else 0.0
            for name, term in terms.items()
        }
        z = sum(factors[name] * term for name, term in terms.items())
        target = self.config.base_ctr
        bias = brentq(lambda b: float(expit(z + b).mean()) - target, -50.0, 50.0, xtol=1e-10)
        return factors, float(bias)

    def _terms(self, dense: np.ndarray, categorical: np.ndarray) -> dict[str, np.ndarray]:
        x = dense.astype(np.float64)
        terms = {
            "first_order": sum(w[categorical[:, f]] for f, w in self.first),
            "dense_linear": x @ self.dense_weight,
        }
        if self.nonlinear is not None:
            a, b, c = self.nonlinear
            terms["dense_nonlinear"] = np.sin(2 * x[:, a]) + x[:, b] * x[:, c]
        for name, group in self.groups.items():
            vectors = [table[categorical[:, f]] for f, table in group]
            terms[name] = _fm(vectors) if name == "order2" else np.prod(vectors, axis=0).sum(1)
        n = len(categorical)
        return {name: np.broadcast_to(np.asarray(t, np.float64), (n,)) for name, t in terms.items()}


def _fm(vectors: list[np.ndarray]) -> np.ndarray:
    """Sum over all pairs of inner products: 0.5 * (|sum v|^2 - sum |v|^2)."""
    total = np.sum(vectors, axis=0)
    return 0.5 * ((total**2).sum(1) - sum((v**2).sum(1) for v in vectors))


def _zipf_cdf(cardinality: int, exponent: float) -> np.ndarray:
    weights = np.arange(1, cardinality + 1, dtype=np.float64) ** -exponent
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def config_from_options(**options: Any) -> SyntheticConfig:
    """A `SyntheticConfig` from keyword options; unknown names raise a `RanknasError`."""
    allowed = {f.name for f in fields(SyntheticConfig)}
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise RanknasError(
            f"synthetic data: unknown option(s) {unknown}; allowed: {sorted(allowed)}"
        )
    return replace(SyntheticConfig(), **options)
