"""genrm-trio: a reward server that turns groups of RL rollouts into rewards with a pairwise judge."""

__version__ = "0.1.0"
