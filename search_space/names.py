"""Names that a model's modules derive from the data's column names.

Copied into every exported `ranknas_model.py` (`nas.export.codegen`): standard library only.
"""

from __future__ import annotations


def table_name(feature: str) -> str:
    """The embedding table of `feature`: `t_<feature>`, with '.' (torch's module paths), '/'
    (a table's shards, `<table>/cw0`) and '%' escaped, so that every column name gives a
    distinct table a module may hold."""
    escaped = feature.replace("%", "%25").replace(".", "%2E").replace("/", "%2F")
    return f"t_{escaped}"
