"""Names that a model's modules derive from the data's column names.

Copied into every exported `ranknas_model.py` (`nas.export.codegen`): standard library only.
"""

from __future__ import annotations


def module_key(column: str) -> str:
    """`column` as a module's name: '.' (which torch refuses: it separates a module's
    path), '/' (which separates a table's shards, `<table>/cw0`) and '%' escaped, so that
    distinct columns give distinct names."""
    return column.replace("%", "%25").replace(".", "%2E").replace("/", "%2F")


def table_name(feature: str) -> str:
    """The embedding table of `feature`: `t_<feature>`, escaped (`module_key`)."""
    return f"t_{module_key(feature)}"


def shown(name: str) -> str:
    """A module or table name as a person reads it: `t_user%2Eid/cw0` is `t_user.id/cw0`
    (the inverse of `module_key` on every escaped part; for display only, where a `/` in a
    column's name may read like a shard's)."""
    return name.replace("%2F", "/").replace("%2E", ".").replace("%25", "%")
