"""Saving and loading small networks as safetensors weights plus a JSON config (no pickle)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from safetensors.torch import load_file, save_file
from torch import nn

from search_space.errors import RanknasError

Net = TypeVar("Net", bound=nn.Module)


def save_net(net: nn.Module, directory: str | Path, stem: str) -> None:
    """`<stem>.safetensors` and `<stem>.json` (the net's dataclass `config`)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    save_file(net.state_dict(), directory / f"{stem}.safetensors")
    (directory / f"{stem}.json").write_text(json.dumps(asdict(net.config), indent=2))


def load_net(
    net_class: type[Net], config_class: type[Any], directory: str | Path, stem: str, what: str
) -> Net:
    """The net saved by `save_net`, in eval mode; a clear error if it is not there."""
    directory = Path(directory)
    try:
        config = config_class(**json.loads((directory / f"{stem}.json").read_text()))
        state = load_file(directory / f"{stem}.safetensors")
    except (OSError, ValueError, TypeError) as exc:
        raise RanknasError(
            f"{directory}: no readable {what} ({exc}); run `ranknas shard train --out "
            f"{directory}` first"
        ) from None
    net = net_class(config)
    net.load_state_dict(state)
    return net.eval()
