"""Search spaces, configurable from YAML (their sections: `search_space.space_configs`).

search_space:
  type: dag            # dag | wukong | dhen | around (with base: PRESET_OR_FILE)
  num_blocks: 5
  ops: [mlp, cross, dot, fm, efc, attention]
  widths: [32, 64, 128]
  embedding_dims: [8, 16]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from search_space.errors import SpecError
from search_space.files import read_data_file
from search_space.schema import DatasetSchema
from search_space.space_configs import SpaceConfig, parse_space_config
from search_space.spaces.around import AroundSpace
from search_space.spaces.base import Categorical, Integer, Parameter, SearchSpace
from search_space.spaces.dag import DagSpace
from search_space.spaces.dhen import DhenSpace
from search_space.spaces.wukong import WukongSpace

SPACES: dict[str, type[SearchSpace]] = {
    "dag": DagSpace,
    "wukong": WukongSpace,
    "dhen": DhenSpace,
    "around": AroundSpace,
}


def make_space(config: SpaceConfig | dict[str, Any], schema: DatasetSchema) -> SearchSpace:
    if isinstance(config, dict):
        config = parse_space_config(config)
    return SPACES[config.type](schema, config)  # type: ignore[attr-defined]


def load_space(path: str | Path, schema: DatasetSchema) -> SearchSpace:
    """A space from a YAML file holding either the space config or `search_space: {...}`."""
    data = read_data_file(path, "the space config", SpecError)
    if isinstance(data, dict) and "search_space" in data:
        data = data["search_space"]
    return make_space(parse_space_config(data, source=f"{path}: search_space"), schema)


__all__ = [
    "SPACES",
    "AroundSpace",
    "Categorical",
    "DagSpace",
    "DhenSpace",
    "Integer",
    "Parameter",
    "SearchSpace",
    "WukongSpace",
    "load_space",
    "make_space",
    "parse_space_config",
]
