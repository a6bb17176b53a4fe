import logging

import pytest
import torch

from search_space.schema import CategoricalFeature, DatasetSchema

# torchrec 1.8 calls a torch.fx helper that torch 2.13 warns about on first use.
logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
# Tiny models: one intra-op thread is faster than two, and far faster on a busy machine.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def small_schema() -> DatasetSchema:
    """A schema small enough that building hundreds of models stays cheap."""
    return DatasetSchema(
        dense=("d0", "d1", "d2", "d3"),
        categorical=tuple(CategoricalFeature(f"c{i}", 20 + 7 * i) for i in range(6)),
        name="small",
    )
