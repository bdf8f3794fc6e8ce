"""Pure, synchronous core: pairing, verdicts, aggregation, fingerprints and group states."""
