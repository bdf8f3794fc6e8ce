"""The Trio runtime: server nursery, group deadlines, waiters and shutdown."""
