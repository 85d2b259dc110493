"""Reproducible benchmarks, each printing one JSON object with a ceiling beside the figure.

- ``datagen``: the one deterministic generator of SDK ingest bodies (shared with the tests).
- ``loadgen``: a closed-loop HTTP/1.1 load generator run in its own process.
- ``ceiling_app``: the bare Litestar + msgspec ingest endpoint that bounds what boxtrail can do.
- ``bench_ingest``: runs the ceiling and the real server under the same load and prints the ratio.
"""
