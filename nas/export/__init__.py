"""Export a trained architecture as a directory that runs without ranknas.

`export_model` writes:

- `architecture.json`: the bound spec;
- `model.safetensors`: the weights (the state dict of `search_space.builder.RankingModel`);
- `ranknas_model.py`: a standalone module that needs only torch and safetensors. It
  holds a copy of the block library (`search_space/shapes.py`, `params.py`, `blocks.py`, with
  their ranknas imports removed) and of `nas/export/standalone_template.py`, then a generated
  `RankingModel` whose constructor writes every shape and setting out and whose `forward` is
  straight-line code, one statement per block. Submodule names match ranknas's
  `RankingModel`, so the state dict loads as is, and every tensor operation is the one
  ranknas's model runs, so outputs are bit-identical for the same weights and inputs (inputs
  laid out alike: CPU kernels round differently for unaligned or column-major tensors);
- `model_card.md`: blocks, costs, metrics, inputs, how to load.

With `register=NAME` the directory is also logged to MLflow as a pyfunc model "from code" (no
pickle: MLflow stores the entry-point source and the files above) and registered as a new
version of NAME, which then gets the alias (`champion` by default).
"""

from nas.export.entry import check_out_dir, export_model, load_exported
from nas.export.layout import (
    ARCHITECTURE_FILE,
    CARD_FILE,
    EXPERIMENT,
    MODULE_FILE,
    WEIGHTS_FILE,
    ExportResult,
)
from nas.export.registry import _PYFUNC_CODE

__all__ = [
    "ARCHITECTURE_FILE",
    "CARD_FILE",
    "EXPERIMENT",
    "MODULE_FILE",
    "WEIGHTS_FILE",
    "_PYFUNC_CODE",
    "ExportResult",
    "check_out_dir",
    "export_model",
    "load_exported",
]
