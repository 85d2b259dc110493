"""Boxtrail's Parquet as Apache Iceberg tables, for the engines platform teams already run
(``BOXTRAIL_ICEBERG=on``; docs/iceberg.md).

``tables``: one table per project in an Iceberg SQL catalog inside boxtrail's metadata
database; a change staged beside the data and committed in the transaction of boxtrail's
own publish (``metadata.catalog.Mirror``). ``upkeep``: the repair at start, snapshot expiry
and the sweep of metadata no snapshot reads.
"""
