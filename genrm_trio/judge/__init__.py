"""The judge client: request building, reply reading, the attempt loop and the transport seam."""
