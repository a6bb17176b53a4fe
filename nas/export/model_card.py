"""`model_card.md`: blocks, costs, metrics, inputs and how to load the export."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from nas.export.layout import (
    ARCHITECTURE_FILE,
    MODULE_FILE,
    WEIGHTS_FILE,
    _Columns,
    requirements,
)
from search_space.architecture import Analysis, Architecture

# ---------------------------------------------------------------------- model card

DIAGRAM_LINK = "![architecture](architecture.png)"  # beside the card in the export directory
REGISTERED_AS = "Registered in the MLflow Model Registry as"  # read back by a re-export


def registry_description(card: str) -> str:
    """The card as a registered version's description: the registry shows no file beside
    it, so the diagram's link (broken there) says where the diagram is instead."""
    return card.replace(
        DIAGRAM_LINK,
        "The diagram is `architecture.png`, beside this card in "
        "the export directory and in this version's `export` artifact.",
    )


def _model_card(
    analysis: Analysis,
    metrics: Mapping[str, Any],
    columns: _Columns,
    arch_digest: str,
    register: str | None = None,
    alias: str | None = "champion",
    provenance: Mapping[str, Any] | None = None,
    step: Mapping[str, Any] | None = None,
    criteo: bool = False,
    plan: Mapping[str, Any] | None = None,
) -> str:
    """The Markdown model card of an export (`provenance`: where the model comes from, e.g.
    study, trial, date, training recipe, Bayes floor, baselines; `criteo`: trained on
    Criteo-format lines, which its example reads)."""
    arch = analysis.arch
    title = arch.name or "ranknas model"
    subject = next((k for k in ("trial", "baseline") if k in (provenance or {})), None)
    if provenance and "study" in provenance and subject:  # not "around-space"
        title = f"{provenance['study']}, {subject} {provenance[subject]} ({title})"
    sections = [
        f"# {title}\n\n"
        f"Exported by ranknas. Architecture digest `{arch_digest}`; "
        f"{analysis.flops:,} FLOPs per example; {analysis.params_total:,} parameters "
        f"({analysis.dense_params:,} dense, {analysis.embedding_params:,} in embeddings).",
        *(["## Provenance\n\n" + _metrics_table(provenance)] if provenance else []),
        "## Metrics of its recorded training run (one seed)\n\n"
        + _metrics_table({("dense params" if k == "params" else k): v for k, v in metrics.items()}),
        "## Inputs\n\n" + _inputs_section(arch, columns),
        f"## Architecture\n\n{DIAGRAM_LINK}\n\n" + _blocks_table(analysis),
        *([_step_section(step, metrics)] if step else []),
        *([_plan_section(plan)] if plan and not step else []),
        "## Files and loading\n\n" + _loading_section(register, alias, criteo),
    ]
    return "\n\n".join(sections) + "\n"


def _plan_section(plan: Mapping[str, Any]) -> str:
    """Where the study's plan put the tables, for a study that predicted no step time."""
    devices, hosts = plan["num_devices"], plan.get("hosts", 1)
    lookups = plan.get("predicted_embedding_step_ms")
    only = "" if lookups is None else f", only its busiest device's lookups: {lookups:.3f} ms"
    return (f"## Sharding on the study's cluster\n\nTables placed by the {plan['method']} "
            f"sharder on {devices} devices over {hosts} host{'s' * (hosts != 1)} "
            "(`sharding_plan.json`: the plan, and the torchrec `ShardingPlan` it makes for "
            "`embedding_bags`); no training step time was predicted (the study's cost was "
            f"not step_ms){only}.")  # fmt: skip


def _step_section(step: Mapping[str, Any], metrics: Mapping[str, Any]) -> str:
    """The predicted training step on the study's cluster, its parts and their source; and
    the step its own sharded training run measured, where it trained sharded."""
    parts = [
        (
            "dense blocks and head, forward and backward ("
            + step.get("dense_source", "measured on the training device")
            + _slowdown(step.get("dense_factor", 1.0))
            + ")",
            step["dense_ms"],
        ),
        ("all-reduce of the dense gradients (the topology's links)", step["allreduce_ms"]),
        (
            f"embedding lookups of the busiest device, rank {step['busiest_device']} "
            "(sharding cost model)",
            step["embedding_ms"],
        ),
        ("its all-to-all traffic (sharding cost model and topology)", step["all_to_all_ms"]),
        ("the sharded runtime's fixed cost (`ranknas shard links`)", step.get("runtime_ms", 0.0)),
        (
            "the runtime's cost of the pooled embeddings (`ranknas shard links`)",
            step.get("pooled_ms", 0.0),
        ),
    ]
    rows = [(what, f"{ms:.3f}") for what, ms in parts] + [
        ("**step**", f"**{step['step_ms']:.3f}**")
    ]
    return (
        f"## Training step on the study's cluster\n\nPredicted before training: "
        f"{step['step_ms']:.3f} ms a step on {step['devices']} devices over "
        f"{step['hosts']} host{'s' if step['hosts'] != 1 else ''}, "
        f"{step['batch_per_device']} examples per device, tables "
        f"placed by the {step['sharder']} sharder (`sharding_plan.json`: the plan, and "
        "the torchrec `ShardingPlan` it makes for `embedding_bags`). The parts run one "
        f"after another. Cost model: {step['cost_model']}.\n\n"
        + _table(["part", "ms"], rows)
        + _measured_step(step, metrics)
    )


def _measured_step(step: Mapping[str, Any], metrics: Mapping[str, Any]) -> str:
    measured = metrics.get("measured_step_ms")
    if measured is None:
        return ""
    processes = sum(name.startswith("rank") and name.endswith("_step_ms") for name in metrics)
    text = (f"\n\nMeasured in its recorded training run: {measured:.3f} ms a step, the slowest "
            f"of {processes} processes on the machine that trained it")  # fmt: skip
    if processes != step["devices"]:
        return text + f" (the prediction above is for {step['devices']} devices)."
    return text + f" ({measured / step['step_ms']:.2f}x the prediction above)."


def _slowdown(factor: float) -> str:
    if factor == 1.0:
        return ""
    return f"; x{factor:.2f} inside a sharded step, as `ranknas shard links` measured"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _metrics_table(metrics: Mapping[str, Any]) -> str:
    if not metrics:
        return "No metrics were given."
    return _table(["metric", "value"], [(name, _format(value, "seed" in name))
                                        for name, value in metrics.items()])  # fmt: skip


def _format(value: Any, plain_int: bool = False) -> str:
    """A metric for a person: 6 significant digits, thousands separated (not in seeds),
    a list item by item (a confirmed trial's per-seed figures)."""
    if isinstance(value, list):
        return ", ".join(_format(v, plain_int) for v in value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value) if plain_int else f"{value:,}"
    return "—" if value is None else str(value)


def _inputs_section(arch: Architecture, columns: _Columns) -> str:
    emb = arch.embedding
    dense = ", ".join(f"`{c}`" for c in columns.dense) or "none"
    rows = [(f"`{f.name}`", _values_per_example(f.name, f.pooling, columns),
             f"{f.num_embeddings:,}", emb.feature_dim(f)) for f in emb.used]  # fmt: skip
    dataset = f"Dataset `{columns.dataset}`. " if columns.dataset else ""
    raw = (
        " Raw values (as the data file holds them) go through `encode_ids`, which maps them "
        "with the training vocabulary or hashing (id 0: missing, 1: not seen in training)."
        if columns.raw_features else ""
    )  # fmt: skip
    return (
        f"{dataset}Dense: {len(columns.dense)} float columns, in this order: {dense}.\n\n"
        f"Categorical: {len(rows)} features, ids in [0, num_embeddings), in this order (the "
        f"columns of the id matrix).{raw}\n\n"
        + _table(["feature", "per example", "num_embeddings", "embedding dim"], rows)
        + f"\n\nThe blocks see every embedding at dim {emb.dim}; a feature of another dim is "
        "projected to it by a linear layer." + _left_out(emb)
    )


def _left_out(emb) -> str:
    names = [f"`{f.name}`" for f in emb.features if f not in emb.used]
    if not names:
        return ""
    return (f" Left out by the search (dim 0: no table, the model never reads them): "
            f"{', '.join(names)}.")  # fmt: skip


def _values_per_example(feature: str, pooling: str, columns: _Columns) -> str:
    if feature in columns.list_features:
        return f"a list ({pooling} of its embeddings)"
    return "one value" if feature in columns.raw_features else "one id"


def _blocks_table(analysis: Analysis) -> str:
    arch = analysis.arch
    rows = []
    for name in analysis.order:
        block = arch.block(name)
        settings = ", ".join(
            f"{key}={json.dumps(list(v) if isinstance(v, tuple) else v)}"
            for key, v in analysis.params[name].items()
            if v is not None
        )
        rows.append(
            (
                f"`{name}`",
                block.op,
                ", ".join(block.inputs),
                settings or "—",
                analysis.shapes[name],
                f"{analysis.block_flops[name]:,}",
                f"{analysis.block_params[name]:,}",
            )
        )
    other_flops = analysis.flops - sum(analysis.block_flops.values())
    other_params = analysis.dense_params - sum(analysis.block_params.values())
    rows.append(
        ("projections + head", "linear", "", "", "logit", f"{other_flops:,}", f"{other_params:,}")
    )
    rows.append(("embeddings", "", "", "", "", "0", f"{analysis.embedding_params:,}"))
    rows.append(("**total**", "", "", "", "", f"{analysis.flops:,}", f"{analysis.params_total:,}"))
    header = ["block", "op", "inputs", "settings", "output", "FLOPs", "params"]
    return (
        f"Blocks in execution order; the head is a linear layer from `{arch.output_block}` to "
        "one logit. FLOPs are per example (2 per multiply-add).\n\n" + _table(header, rows)
    )


CSV_ROWS = """\
# raw rows, columns as in training; newline="": a quoted field's line break kept as written
rows = list(csv.DictReader(open("new_rows.csv", newline="")))"""
CRITEO_ROWS = """\
columns = ["label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
rows = [dict(zip(columns, line.rstrip("\\n").split("\\t"))) for line in open("new_lines.tsv")]
# a Criteo line's 40 fields, no header; a feature the model does not read is ignored"""


def _loading_section(register: str | None, alias: str | None, criteo: bool = False) -> str:
    text = f"""
        - `{ARCHITECTURE_FILE}`: the architecture spec (`Architecture.load` in ranknas).
        - `{WEIGHTS_FILE}`: the weights, a state dict in safetensors format.
        - `{MODULE_FILE}`: a standalone module that rebuilds the model with torch and
          safetensors only (no ranknas or torchrec needed) and loads the weights without pickle.
        - `preprocessing.json`: the transforms, vocabularies and hashing fitted on the
          training split (empty where nothing was fitted), which `prepare_dense` and
          `encode_ids` apply to raw values; `architecture.png` and this card.

        ```python
        import csv
        import sys
        import torch

        sys.path.insert(0, "path/to/this/directory")
        import ranknas_model as m

        model = m.load("path/to/this/directory")
        READ_ROWS
        dense = m.prepare_dense([[r[c] for c in m.DENSE_COLUMNS] for r in rows],
                                "path/to/this/directory")
        ids = m.encode_ids([[r[f] for r in rows] for f in m.FEATURES], m.FEATURES,
                           "path/to/this/directory")
        with torch.no_grad():
            probabilities = torch.sigmoid(model(dense, ids))
        ```

        In ranknas: `nas.export.load_exported("path/to/this/directory")`.
    """
    text = textwrap.dedent(text).strip().replace("READ_ROWS", CRITEO_ROWS if criteo else CSV_ROWS)
    if criteo:
        text = text.replace("import csv\n", "")
    module_needs = [pin for pin in requirements() if not pin.startswith("pandas")]
    text += (f"\n\nTo run the module elsewhere: `pip install {' '.join(module_needs)}`, the "
             "versions it was exported with (numpy: else torch warns on import).")  # fmt: skip
    if register and alias:
        text += (
            f"\n\n{REGISTERED_AS} `{register}` with the alias "
            f'`{alias}`: `mlflow.pyfunc.load_model("models:/{register}@{alias}").predict(df)` '
            "takes a DataFrame with the dense and categorical columns above and returns click "
            "probabilities (with `MLFLOW_TRACKING_URI` set to the server it is registered on)."
        )
    elif register:
        text += (
            f"\n\n{REGISTERED_AS} a version of `{register}`, "
            "without an alias (not the study's best): "
            f'`mlflow.pyfunc.load_model("models:/{register}/VERSION").predict(df)`, with the '
            "version `ranknas export` printed, takes a DataFrame with the dense and "
            "categorical columns above and returns click probabilities (with "
            "`MLFLOW_TRACKING_URI` set to the server it is registered on)."
        )
    return text
