"""An answer through the fitted detectors: features, sets, verdicts.

An answer through the fitted detectors: features extracted once per answer and cached
(SQLite, Parquet shards), detector sets and their experts, reviewable word spans and
the verdicts of ``judge``."""
