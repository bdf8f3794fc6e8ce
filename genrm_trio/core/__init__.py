"""Pure, synchronous core: pairing, verdicts, aggregation, fingerprints and the group state machine."""
