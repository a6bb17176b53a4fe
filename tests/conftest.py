import logging
from collections.abc import Iterator

import pytest
import torch

from mlflow_server import ServerConfig, ServerInfo, down, up
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


@pytest.fixture(scope="session")
def server_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerConfig]:
    config = ServerConfig(data_dir=tmp_path_factory.mktemp("mlflow"), port=0)
    yield config
    down(config)


@pytest.fixture
def server(server_config: ServerConfig) -> ServerInfo:
    """A real `mlflow server`, one for the whole run (each start costs 11-15 s): started on
    first use, and again for the next test where a test stopped it on purpose (a restart
    comes back on the same port and data)."""
    info = up(server_config)
    server_config.port = info.port
    return info
