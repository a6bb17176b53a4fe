"""The base of every config section read from a user's YAML (a study, a search space)."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


class Section(BaseModel):
    """Unknown keys, true/false where a number goes, and .inf/.nan are refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """YAML's true and false where numbers go are refused: pydantic reads true as 1, so
        `budget: {trials: true}` ran one trial."""
        kinds = _leaf_types(cls.model_fields[info.field_name].annotation)
        items = value if isinstance(value, list) else [value]
        if kinds & {int, float} and bool not in kinds and any(isinstance(v, bool) for v in items):
            raise ValueError(f"{str(value).lower()} is not a number: give a number")
        return value


def _leaf_types(annotation: Any) -> set[Any]:
    """The types in `annotation`, through unions and containers: {int, NoneType} for
    `list[int] | None`."""
    args = get_args(annotation)
    return set().union(*map(_leaf_types, args)) if args else {annotation}
