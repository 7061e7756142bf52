"""Data flows: every message that left each site, summarised from the message inventory."""

from __future__ import annotations

import pandas as pd

from studyfiles.inventory import MessageInventory

COLUMNS = [
    "site",
    "task",
    "messages",
    "refused",
    "bytes_out",
    "bytes_in",
    "first_sent",
    "last_sent",
]


def data_flows(inventory: MessageInventory, analysis: str | None = None) -> pd.DataFrame:
    """Per site and task: replies sent (``bytes_out``), requests received, refusals, times.

    ``bytes_out`` counts what left the site (its encoded replies, refusals
    included); ``bytes_in`` what it received. Indexed by (site, task), in
    the order the tasks were first asked.
    """
    frame = inventory.to_frame(analysis)
    if frame.empty:
        return pd.DataFrame(columns=COLUMNS).set_index(["site", "task"])
    frame["refused"] = frame["status"].eq("refused")
    grouped = frame.groupby(["site", "task"], sort=False)
    table = pd.DataFrame(
        {
            "messages": grouped.size(),
            "refused": grouped["refused"].sum(),
            "bytes_out": grouped["reply_bytes"].sum(),
            "bytes_in": grouped["request_bytes"].sum(),
            "first_sent": grouped["sent_at"].min(),
            "last_sent": grouped["sent_at"].max(),
        }
    )
    return table.sort_index(level="site", sort_remaining=False)
