"""The server: quart-trio routes over the wire layer, the accept and read loops under
hypercorn, the receive budget and spool for waiting bodies, /metrics, /healthz, /readyz and
OpenAPI.

The face is ``app`` (``create_app``, one server instance), ``serving`` (the accept side `serve`
runs it behind) and ``read_gates`` (what `serve` hands the app so that a body can wait unread);
the modules whose names begin with ``_`` are the server's own, ``_hypercorn_seam`` among them
(every internal of hypercorn and h11 `serve` relies on).
"""

__all__ = ["app", "read_gates", "serving"]
