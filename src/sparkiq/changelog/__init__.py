"""The changelog: per-table manifests, per-(partition, batch) segments and commit records.

The only component that writes it is the table's Spark query (through the sink); every
replica reads it. See :mod:`sparkiq.changelog.log` for the directory layout and invariants.
"""

from sparkiq.changelog.commit import CommitRecord
from sparkiq.changelog.log import Changelog, check_table_name, list_tables
from sparkiq.changelog.manifest import TableManifest
from sparkiq.changelog.segment import SegmentInfo
from sparkiq.changelog.storage import Storage, open_storage

__all__ = [
    "Changelog",
    "CommitRecord",
    "SegmentInfo",
    "Storage",
    "TableManifest",
    "check_table_name",
    "list_tables",
    "open_storage",
]
