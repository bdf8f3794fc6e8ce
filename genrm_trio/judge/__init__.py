"""The judge client: request building, reply reading and the attempt loop (httpx on Trio)."""
