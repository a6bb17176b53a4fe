"""Search spaces, configurable from YAML.

search_space:
  type: dag            # dag | wukong | dhen | around (with base: PRESET_OR_FILE)
  num_blocks: 5
  ops: [mlp, cross, dot, fm, efc, attention]
  widths: [32, 64, 128]
  embedding_dims: [8, 16]
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Discriminator, Tag, TypeAdapter, ValidationError

from search_space.errors import SpecError
from search_space.files import read_data_file
from search_space.schema import DatasetSchema
from search_space.spaces.around import AroundConfig, AroundSpace
from search_space.spaces.base import Categorical, Integer, Parameter, SearchSpace, SpaceConfig
from search_space.spaces.dag import DagConfig, DagSpace
from search_space.spaces.dhen import DhenConfig, DhenSpace
from search_space.spaces.wukong import WukongConfig, WukongSpace

SPACES: dict[str, type[SearchSpace]] = {
    "dag": DagSpace,
    "wukong": WukongSpace,
    "dhen": DhenSpace,
    "around": AroundSpace,
}


def _space_type(value: Any) -> Any:
    return value.get("type") if isinstance(value, dict) else getattr(value, "type", None)


# A callable discriminator: a field discriminator refuses the sections' before-validators
# (`Section`), which run on every field, `type` included.
AnySpaceConfig = Annotated[
    Annotated[DagConfig, Tag("dag")]
    | Annotated[WukongConfig, Tag("wukong")]
    | Annotated[DhenConfig, Tag("dhen")]
    | Annotated[AroundConfig, Tag("around")],
    Discriminator(
        _space_type,
        custom_error_type="space_type",
        custom_error_message=f"type: use one of {', '.join(SPACES)}",
    ),
]
_CONFIG = TypeAdapter(AnySpaceConfig)


def parse_space_config(data: Any, source: str = "search_space") -> SpaceConfig:
    """Validate a space config mapping; errors name the field and what is allowed."""
    if isinstance(data, dict) and "type" not in data:
        raise SpecError(f"{source}.type: missing; one of {', '.join(SPACES)}")
    try:
        return _CONFIG.validate_python(data)
    except ValidationError as exc:
        tag = data.get("type") if isinstance(data, dict) else None
        raise SpecError(format_validation_error(exc, source, skip=tag)) from None


def format_validation_error(
    exc: ValidationError, source: str, skip: Any = None, joiner: str = "."
) -> str:
    """One line per problem: `source.field.path: message` (`skip`: a union's tag in loc;
    `joiner` ": " for a source that is a file)."""
    lines = []
    for error in exc.errors():
        loc = list(error["loc"])
        if loc and skip is not None and loc[0] == skip:
            loc = loc[1:]
        location = ".".join(str(part) for part in loc)
        lines.append(
            f"{source}{joiner}{location}: {_message(error)}"
            if location
            else f"{source}: {_message(error)}"
        )
    return "\n".join(lines)


def _message(error: Any) -> str:
    """Pydantic's message, less the "Value error, " that it puts before a validator's own."""
    return error["msg"].removeprefix("Value error, ")


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
