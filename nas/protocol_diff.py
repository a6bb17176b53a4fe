"""What a study's runs share, told apart from what a new run would use: the settings that
differ, as `name: old -> new`. Torch-free, so that a command refuses a changed recipe before
it loads the data (minutes on a large log) or starts its workers; the data's half of the
protocol is checked once the data is loaded (`nas.protocol.check_protocol`)."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from nas.config import StudyConfig
from nas.storage import redact
from nas.trial_record import StudyAttr
from search_space.errors import RanknasError

CONSTRAINTS = ("max_mflops", "max_params", "max_latency_ms", "max_step_ms")  # `over_constraint`
# What a study recorded before a setting existed trained with (its protocol lacks the key).
SETTINGS_BEFORE_THEY_WERE_RECORDED = {"lr_schedule": "constant", "search": None}
# Settings recorded only since 2026-12-07: a study from before is taken to have had today's.
RECORDED_SINCE = ("trial_seconds",)
# `budget`'s settings of each trial's training, in the protocol's training half
PER_TRIAL = ("examples_per_trial", "epochs_per_trial", "trial_seconds")
_UNSET = object()  # a setting one of two protocols does not name


def _short(value: Any) -> str:
    if value is _UNSET:
        return "(not set)"
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def training_protocol(config: StudyConfig) -> dict[str, Any]:
    """The training half of a study's protocol: the recipe and the examples each trial
    trains on. Not the device, threads or compilation: where and how fast, not what is
    computed."""
    how = {"device", "threads", "cuda_graph", "compile"}
    training = config.training.model_dump(mode="json", exclude=how)
    return training | config.budget.model_dump(mode="json", include=set(PER_TRIAL))


def recorded_training(protocol: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """The training half of a recorded protocol, with the settings added since it was (and
    those recorded since, as `now`, the training half of today's)."""
    unknown = {key: now.get(key) for key in RECORDED_SINCE}
    return SETTINGS_BEFORE_THEY_WERE_RECORDED | unknown | protocol.get("training", {})


def check_settings(recorded: dict[str, Any] | None, config: StudyConfig) -> None:
    """Refuses a run of a study (its recorded attributes: `recorded`) under another training
    recipe than its runs had, or, where step time is a cost, another cluster (the steps of
    its trials were predicted for the one recorded): before the data is loaded."""
    recorded = recorded or {}
    changes = []
    if (protocol := recorded.get(StudyAttr.PROTOCOL)) is not None:
        now = training_protocol(config)
        changes += protocol_changes(recorded_training(protocol, now), now, "training.")
    changes += cluster_changes(recorded, config)
    if ceilings := ceiling_changes(recorded, config):
        raise other_settings(config, changes + ceilings, CEILINGS_CHANGED)
    if changes:
        raise other_settings(config, changes)


def configured_ceilings(config: StudyConfig) -> dict[str, Any]:
    """`objectives.max_*` as the config gives them (`best_baseline` and `base` unresolved)."""
    return {key: getattr(config.objectives, key) for key in CONSTRAINTS}


# why a searched study's ceilings are held
CEILINGS_CHANGED = (" (its trials above a new ceiling would stay its best, and points skipped "
                    "under an old one were never trained)")  # fmt: skip


def ceiling_changes(recorded: dict[str, Any], config: StudyConfig) -> list[str]:
    """How the ceilings of a study that has searched (its recorded attributes: `recorded`)
    changed."""
    ceilings = recorded.get(StudyAttr.CEILINGS)
    if ceilings is None or StudyAttr.SEARCH_SPACE not in recorded:
        return []
    # a ceiling added to ranknas since the study recorded its own: unset then too
    now = {k: v for k, v in configured_ceilings(config).items() if k in ceilings or v is not None}
    return protocol_changes(ceilings, now, "objectives.")


def cluster_changes(recorded: dict[str, Any], config: StudyConfig) -> list[str]:
    """How the cluster of a step-time study (its recorded attributes: `recorded`) changed."""
    cluster = recorded.get(StudyAttr.STEP_CLUSTER)
    if cluster is None and StudyAttr.STEP_DEVICES in recorded:  # recorded before the rest
        cluster = {"devices": recorded[StudyAttr.STEP_DEVICES]}
    if cluster is None or not config.objectives.needs_step_time:
        return []
    now = {key: value for key, value in step_cluster(config).items() if key in cluster}
    return protocol_changes(cluster, now, "sharding.")


def step_cluster(config: StudyConfig) -> dict[str, Any]:
    """The settings of `sharding` that a predicted step time depends on, as recorded: the
    files' contents, not their paths (each machine has its own)."""
    s = config.sharding  # hosts left out: 8 devices a host (`cost_models.sharding.step.topology`)
    hosts = s.hosts or max(1, math.ceil(s.devices / 8))
    return {
        "devices": s.devices,
        "hosts": hosts,
        "method": s.method,
        "runtime_ms": s.runtime_ms,
        "links_content": _content(s.links),
        "dense_model_content": _content(s.dense_model),
    }


def _content(path: str | None) -> str | None:
    """A file's content digest (None without a file)."""
    if path is None:
        return None
    try:
        with Path(path).open("rb") as file:
            return "sha256:" + hashlib.file_digest(file, "sha256").hexdigest()[:16]
    except OSError as exc:
        raise RanknasError(f"{path}: cannot read it ({exc.strerror})") from None


def other_settings(config: StudyConfig, changes: list[str], why: str = "") -> RanknasError:
    changes = [_as_configured(change) for change in changes]
    more = len(changes) - 4
    shown = "; ".join(changes[:4]) + (f"; and {more} more" if more > 0 else "")
    return RanknasError(
        f"study {config.name!r} in {redact(config.storage)} was run with other settings "
        f"({shown}){why}: runs under both would not compare; put them back, or give the "
        "study a new name"
    )


def _as_configured(change: str) -> str:
    """A change named where the YAML sets it: `budget.epochs_per_trial`, which the protocol
    keeps in its training half."""
    key = change.partition(":")[0].removeprefix("training.")
    return "budget." + change.removeprefix("training.") if key in PER_TRIAL else change


def protocol_changes(recorded: dict[str, Any], now: dict[str, Any], prefix: str = "") -> list[str]:
    """The settings that differ between two protocols, as `name: old -> new`."""
    changes = []
    for key in sorted(set(recorded) | set(now)):
        old, new = recorded.get(key, _UNSET), now.get(key, _UNSET)
        name = f"{prefix}{key}"
        if isinstance(old, dict) and isinstance(new, dict):
            changes += protocol_changes(old, new, f"{name}.")
        elif _named_lists(old, new) and old != new:  # (a schema's columns)
            changes += _named_changes(name, old, new)
        elif _lists_of_mappings(old, new) and old != new:  # the items that changed, by name
            changes += _item_changes(name, old, new)
        elif old != new:
            changes.append(f"{name}: {_short(old)} -> {_short(new)}")
    return changes


def _lists_of_mappings(old: Any, new: Any) -> bool:
    """Two lists of as many mappings (a schema's columns): told item by item, as a whole
    they are cut short before the change shows."""
    lists = isinstance(old, list) and isinstance(new, list) and len(old) == len(new)
    return lists and all(isinstance(item, dict) for item in (*old, *new))


def _named_lists(old: Any, new: Any) -> bool:
    """Two lists of distinct names, or two of mappings with distinct names: told by the
    names added, left out, moved and changed, as a whole they are cut short before the
    change shows."""
    names = [_list_names(v) for v in (old, new)]
    if any(n is None or len(set(n)) != len(n) for n in names):
        return False
    return len({type(item) for item in (*old, *new)}) <= 1


def _list_names(value: Any) -> list[str] | None:
    if not isinstance(value, list):
        return None
    if all(isinstance(item, str) for item in value):
        return value
    if all(isinstance(item, dict) and isinstance(item.get("name"), str) for item in value):
        return [item["name"] for item in value]
    return None


def _named_changes(name: str, old: list, new: list) -> list[str]:
    """`name: added a, b; left out c` and what changed in the items both name; or that the
    same items are in another order."""
    before, after = (dict(zip(_list_names(v), v, strict=True)) for v in (old, new))
    added = [n for n in after if n not in before]
    left_out = [n for n in before if n not in after]
    named = (("added", added), ("left out", left_out))
    parts = [f"{what} {_names(names)}" for what, names in named if names]
    changes = [f"{name}: {'; '.join(parts)}"] if parts else []
    both = [n for n in before if n in after]
    if both != [n for n in after if n in before]:  # a column's place is its input's index
        changes.append(f"{name}: {_names([n for n in after if n in before])} in another order")
    kept = [before[n] for n in both], [after[n] for n in both]
    if kept[0] != kept[1] and all(isinstance(item, dict) for item in kept[0]):
        changes += _item_changes(name, *kept)
    return changes


def _names(names: list[str], most: int = 6) -> str:
    more = f", and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


def _item_changes(name: str, old: list[dict], new: list[dict], most: int = 2) -> list[str]:
    """What changed in the items of two lists of mappings: each setting of up to `most`
    items, else which items (a data set rewritten: every column's cardinality moved)."""
    items = [(f"{name}[{_item_name(a, b, i)}]", a, b)
             for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b]  # fmt: skip
    if len(items) > most:
        names = ", ".join(item.removeprefix(name) for item, _, _ in items[:6])
        return [f"{name}: {len(items)} of {len(old)} changed ({names}{', ...' * (len(items) > 6)})"]
    return [change for item, a, b in items for change in protocol_changes({item: a}, {item: b})]


def _item_name(old: Any, new: Any, index: int) -> str:
    """A list item by its `name` where both have the same one (a schema's columns), else
    by its index."""
    named = isinstance(old, dict) and isinstance(new, dict) and "name" in old
    return str(old["name"]) if named and old["name"] == new.get("name") else str(index)
