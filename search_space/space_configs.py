"""The search spaces' YAML sections, validated without the block library.

What `search_space:` in a study config may hold, one pydantic model per space type, and
the union a study config parses it with. Reading a config (`ranknas status study.yaml`)
so needs no torch: a block's size ranges come from the block library (`block_param`)
only when a config names sizes. The spaces themselves are in `search_space.spaces`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal, get_args

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from search_space.errors import SpecError
from search_space.params import Param
from search_space.sections import Section

SPACE_TYPES = ("dag", "wukong", "dhen", "around")  # `spaces.SPACES`, whose keys a test checks

DAG_OPS = ("mlp", "cross", "gating", "sum", "dot", "fm", "efc", "attention", "wukong", "dhen")
# the block parameter a block's `width` becomes, by op (`DagSpace._params`)
WIDTH_PARAMS = {"mlp": "widths", "sum": "width", "cross": "low_rank"}
# `blocks.DHEN_MODULES`' names (a test checks them)
DHEN_MODULE_NAMES = ("dot", "attention", "dcn", "conv", "linear")
AGGREGATIONS = ("sum", "weighted_sum", "concat")
INSERT_OPS = ("cross", "fm", "dot", "attention", "wukong", "dhen")
BEST_BASELINE = "best_baseline"  # a study's base: its best baseline, once they have trained


class SpaceConfig(Section):
    """Settings every space shares: the searched embedding dims."""

    embedding_dims: list[int] = Field(default=[8, 16], min_length=1)
    feature_dims: list[int] | None = Field(
        default=None, description="per-feature dims to search; null: one shared dim"
    )
    # whether `feature_dims` may hold 0: the feature left out of the model (`around` only)
    DROPS_FEATURES: ClassVar[bool] = False

    @field_validator("embedding_dims", "feature_dims")
    @classmethod
    def _dims(cls, value: list[int] | None, info: ValidationInfo) -> list[int] | None:
        per_feature = info.field_name == "feature_dims"
        low = 0 if cls.DROPS_FEATURES and per_feature else 1
        if value is not None and any(v < low or v > 1024 for v in value):
            hint = (" (0, a feature left out, is searched by the around space only)"
                    if per_feature and low and 0 in value else "")  # fmt: skip
            raise ValueError(f"every dim must be in [{low}, 1024]{hint}")
        return value


def within(values: list[int] | None, uses: Mapping[str, Param]) -> list[int] | None:
    """`values` of a searched size, each in the range of the block parameter of every use
    (`{"cross low_rank": ...}`): refused here, it names the file and the field; in a trial,
    it failed the study naming neither."""
    for value in values or ():
        for use, param in uses.items():
            _, problem = param.check_int(value)
            if problem:
                raise ValueError(f"{problem} ({use})")
    return values


def known(values: list[str], allowed: Sequence[str], kind: str, offered: str) -> list[str]:
    """`values` where each is one of `allowed`; else the unknown ones, and what is offered."""
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise ValueError(f"unknown {kind}(s) {unknown}; {offered} {list(allowed)}")
    return values


def block_param(op: str, name: str) -> Param:
    """Block parameter `name` of `op` as the block library declares it (its range)."""
    from search_space.blocks import OPS  # torch: only once a config names a size

    return OPS[op].PARAMS[name]


class DagConfig(SpaceConfig):
    type: Literal["dag"] = "dag"
    num_blocks: int = Field(default=5, ge=1, le=32)
    ops: list[str] = Field(
        default=["mlp", "cross", "gating", "sum", "dot", "fm", "efc", "attention"], min_length=1
    )
    widths: list[int] = Field(default=[16, 32, 64, 128], min_length=1)
    counts: list[int] = Field(default=[4, 8, 16], min_length=1)
    max_inputs: int = Field(default=2, ge=1, le=8)

    @field_validator("ops")
    @classmethod
    def _known_ops(cls, ops: list[str]) -> list[str]:
        return known(ops, DAG_OPS, "op", "the DAG space offers")

    @field_validator("widths")
    @classmethod
    def _widths(cls, widths: list[int], info: ValidationInfo) -> list[int]:
        # every width is at least an mlp's; all ops' ranges when `ops` is itself refused
        ops = {"mlp", *(info.data.get("ops") or DAG_OPS)}
        return within(widths, {f"{op} {name}": block_param(op, name)
                               for op, name in WIDTH_PARAMS.items() if op in ops})  # fmt: skip

    @field_validator("counts")
    @classmethod
    def _counts(cls, counts: list[int]) -> list[int]:
        return within(counts, {"efc num_out": block_param("efc", "num_out")})


class StackConfig(SpaceConfig):
    max_layers: int = Field(default=3, ge=1, le=16)
    top_width: list[int] = Field(default=[32, 64, 128], min_length=1)
    bottom_widths: list[int] = Field(
        default=[64], description="bottom MLP widths; a last layer of the embedding dim is added"
    )

    @field_validator("top_width", "bottom_widths")
    @classmethod
    def _widths(cls, widths: list[int]) -> list[int]:
        return within(widths, {"mlp widths": block_param("mlp", "widths")})


class WukongConfig(StackConfig):
    type: Literal["wukong"] = "wukong"
    max_layers: int = Field(default=4, ge=1, le=16)
    num_fm: list[int] = Field(default=[4, 8, 16], min_length=1)
    num_lc: list[int] = Field(default=[4, 8, 16], min_length=1)
    rank: list[int] = Field(default=[8, 16, 24], min_length=1)
    max_fmb_depth: int = Field(default=2, ge=1, le=8)
    fmb_width: list[int] = Field(default=[32, 64, 128], min_length=1)

    @field_validator("num_fm", "num_lc", "rank", "fmb_width")
    @classmethod
    def _sizes(cls, sizes: list[int], info: ValidationInfo) -> list[int]:
        name = "fmb_widths" if info.field_name == "fmb_width" else info.field_name
        return within(sizes, {f"wukong {name}": block_param("wukong", name)})


class DhenConfig(StackConfig):
    type: Literal["dhen"] = "dhen"
    modules: list[str] = Field(default=list(DHEN_MODULE_NAMES), min_length=1)
    max_modules: int = Field(default=3, ge=1, le=len(DHEN_MODULE_NAMES))
    aggregations: list[str] = Field(default=list(AGGREGATIONS), min_length=1)
    hidden: list[int] = Field(default=[32, 64], min_length=1)

    @field_validator("modules")
    @classmethod
    def _known_modules(cls, modules: list[str]) -> list[str]:
        return known(modules, DHEN_MODULE_NAMES, "module", "DHEN offers")

    @field_validator("hidden")
    @classmethod
    def _hidden(cls, hidden: list[int]) -> list[int]:
        return within(hidden, {"dhen hidden": block_param("dhen", "hidden")})

    @field_validator("aggregations")
    @classmethod
    def _known_aggregations(cls, aggregations: list[str]) -> list[str]:
        return known(aggregations, AGGREGATIONS, "aggregation", "allowed")


class AroundConfig(SpaceConfig):
    type: Literal["around"] = "around"
    base: str = Field(
        description="a preset name, an architecture JSON file, or best_baseline (in a study: "
        "the baseline of the best validation metric, once the baselines have trained)"
    )
    embedding_dims: list[int] | None = Field(  # type: ignore[assignment]
        default=None, min_length=1, description="default: half, the same and twice the base's"
    )
    width_multipliers: list[float] = Field(default=[0.5, 1.0, 2.0], min_length=1)
    swap_ops: bool = True
    connections: bool = Field(default=True, description="search adding/removing inputs")
    insert_ops: list[str] = Field(default=list(INSERT_OPS))
    insert_at: list[str] | None = Field(default=None, description="default: the output block")
    DROPS_FEATURES: ClassVar[bool] = True  # feature_dims may hold 0: a feature left out

    @field_validator("base")
    @classmethod
    def _base(cls, base: str, info: ValidationInfo) -> str:
        from search_space.preset_names import checks_files, unknown_architecture

        problem = checks_files(info.context) and unknown_architecture(base, (BEST_BASELINE,))
        if problem:  # before any data is read
            raise ValueError(problem)
        return base

    @field_validator("width_multipliers")
    @classmethod
    def _multipliers(cls, values: list[float]) -> list[float]:
        if any(not 0 < v <= 16 for v in values):
            raise ValueError("every multiplier must be in (0, 16]")
        return values

    @field_validator("insert_ops")
    @classmethod
    def _insert_ops(cls, ops: list[str]) -> list[str]:
        return known(ops, INSERT_OPS, "op", "insertable:")


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
        custom_error_message=f"type: use one of {', '.join(SPACE_TYPES)}",
    ),
]
_CONFIG = TypeAdapter(AnySpaceConfig)
SPACE_CONFIGS = (DagConfig, WukongConfig, DhenConfig, AroundConfig)


def parse_space_config(data: Any, source: str = "search_space") -> SpaceConfig:
    """Validate a space config mapping; errors name the field and what is allowed."""
    if isinstance(data, dict) and "type" not in data:
        raise SpecError(f"{source}.type: missing; one of {', '.join(SPACE_TYPES)}")
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
