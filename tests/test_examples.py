"""The shipped examples stay valid: every study config validates and every space builds."""

from pathlib import Path

import pytest

from nas.config import load_config
from search_space.schema import synthetic_schema
from search_space.spaces import load_space

EXAMPLES = Path(__file__).parent.parent / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_validates(path):
    if path.name.startswith("space_"):  # a search space alone, for `ranknas space sample`
        space = load_space(path, synthetic_schema(seed=0))
        assert space.sample(seed=0).blocks
    else:
        assert load_config(path).name
