"""genrm-trio: turns groups of RL rollouts into rewards with a pairwise generative judge."""

__version__ = "0.1.0"

from genrm_trio.core.canonical import fingerprint
from genrm_trio.http.app import create_app

__all__ = ["__version__", "create_app", "fingerprint"]
