"""How the domain tasks show their work in the UI: a frame as a table, and the run's marks."""

from datetime import datetime
from typing import TYPE_CHECKING, Any

import dagster as dg

from orchestration.task_run import TaskRun
from resources.core.due import format_due
from resources.core.instants import iso

if TYPE_CHECKING:
    import pandas as pd

#: Rows shown in the "first rows" tables of the UI.
PREVIEW_ROWS = 10


def _cell(value: Any) -> str | int | float | bool:
    import numpy as np
    import pandas as pd

    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return ""
    if isinstance(value, pd.Timestamp | datetime | np.datetime64):
        return iso(pd.Timestamp(value).to_pydatetime())
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, bool | int | float | str):
        return value
    return str(value)


def table_metadata(frame: "pd.DataFrame", limit: int | None = PREVIEW_ROWS) -> dg.MetadataValue:
    """A frame (its first `limit` rows) as a table the UI renders."""
    shown = frame if limit is None else frame.head(limit)
    columns = [str(c) for c in shown.columns]
    records = [
        dg.TableRecord({c: _cell(v) for c, v in zip(columns, row, strict=True)})
        for row in shown.itertuples(index=False)
    ]
    schema = dg.TableSchema(columns=[dg.TableColumn(c) for c in columns])
    return dg.MetadataValue.table(records=records, schema=schema)


def run_metadata(run: TaskRun) -> dict[str, Any]:
    """Where a materialization came from: its due (or as-of instant) and its ledger entry."""
    return {"as_of": format_due(run.as_of), "ledger_entry": run.entry.id}
