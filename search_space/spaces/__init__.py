"""Search spaces, configurable from YAML.

search_space:
  type: dag            # dag | wukong | dhen | around (with base: PRESET_OR_FILE)
  num_blocks: 5
  ops: [mlp, cross, dot, fm, efc, attention]
  widths: [32, 64, 128]
  embedding_dims: [8, 16]
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, get_args

from pydantic import BaseModel, Discriminator, Tag, TypeAdapter, ValidationError

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
SPACE_CONFIGS = (DagConfig, WukongConfig, DhenConfig, AroundConfig)


def parse_space_config(data: Any, source: str = "search_space") -> SpaceConfig:
    """Validate a space config mapping; errors name the field and what is allowed."""
    if isinstance(data, dict) and "type" not in data:
        raise SpecError(f"{source}.type: missing; one of {', '.join(SPACES)}")
    try:
        return _CONFIG.validate_python(data)
    except ValidationError as exc:
        tag = data.get("type") if isinstance(data, dict) else None
        raise SpecError(
            format_validation_error(exc, source, skip=tag, models=SPACE_CONFIGS)
        ) from None


def format_validation_error(
    exc: ValidationError,
    source: str,
    skip: Any = None,
    joiner: str = ".",
    models: Sequence[type[BaseModel]] = (),
) -> str:
    """One line per problem: `source.field.path: message` (`skip`: a union's tag in loc;
    `joiner` ": " for a source that is a file; `models`: the validated model(s), so that an
    unknown field is answered with the closest known one)."""
    lines = []
    for error in exc.errors():
        loc = list(error["loc"])
        message = _message(error)
        if error["type"] == "extra_forbidden" and models:
            message += _suggestion(str(loc[-1]), known_fields(models, loc[:-1]))
        if loc and skip is not None and loc[0] == skip:
            loc = loc[1:]
        location = ".".join(str(part) for part in loc)
        lines.append(
            f"{source}{joiner}{location}: {message}" if location else f"{source}: {message}"
        )
    return "\n".join(lines)


def _message(error: Any) -> str:
    """Pydantic's message, less the "Value error, " that it puts before a validator's own
    (which names the value where it helps), and with the value given where pydantic's own
    check refused a plain one ("Input should be a valid integer" of `three`)."""
    message = error["msg"].removeprefix("Value error, ")
    given = error.get("input")
    own = error["type"] in ("value_error", "assertion_error", "missing", "extra_forbidden")
    if own or not isinstance(given, str | int | float | bool) or repr(given) in message:
        return message
    shown = repr(given)
    return f"{message} (got {shown if len(shown) <= 60 else shown[:57] + '...'})"


def known_fields(models: Sequence[type[BaseModel]], loc: Sequence[Any]) -> list[str]:
    """The field names a mapping at `loc` (inside one of `models`) may hold; a part of `loc`
    that is no field picks the models whose `type` it names (a tagged union's tag)."""
    candidates = list(models)
    for part in loc:
        inner = [m for c in candidates for name, field in c.model_fields.items()
                 if part in (name, field.alias) for m in _models_in(field.annotation)]  # fmt: skip
        candidates = inner or [c for c in candidates if part in _type_tags(c)]
        if not candidates:
            return []
    # as a config writes them: a field's alias where it has one (`data.schema`)
    return sorted({f.alias or n for c in candidates for n, f in c.model_fields.items()})


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _type_tags(model: type[BaseModel]) -> tuple[Any, ...]:
    field = model.model_fields.get("type")
    return get_args(field.annotation) if field is not None else ()


def _suggestion(name: str, known: list[str]) -> str:
    if not known:
        return ""
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else f"; this section takes {', '.join(known)}"


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
