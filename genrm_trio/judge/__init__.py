"""The judge client: request building, reply interpretation and the attempt loop, on httpx and Trio."""
