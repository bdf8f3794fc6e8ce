"""The server: quart-trio routes over the wire layer, the accept and read loops under
hypercorn, the receive budget and spool for waiting bodies, /metrics, /healthz and OpenAPI."""
