"""Benchmark scripts (each has ``main()``; run them as ``python -m benchmarks.<name>``).

* ``serve_bench``: load generator against a running app's OpenAI endpoint (or one it starts);
* ``compare``: Serve async_chunk / sync vs the offline pipeline vs transformers' ``generate()``;
* ``transport_bench``: our stage-to-stage hand-off vs an in-process queue vs /dev/shm files.

``metrics`` holds the pure pieces (SSE parsing, per-request record, percentiles, RTF) that
``tests/benchmarks`` checks without timing anything.
"""
