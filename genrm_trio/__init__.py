"""genrm-trio: turns groups of RL rollouts into rewards with a pairwise generative judge."""

__version__ = "0.1.0"
