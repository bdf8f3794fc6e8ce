"""NeMo Gym's runner starts this file (`entrypoint: app.py`) as the genrm-trio resources server.

It reads the run's config from NEMO_GYM_CONFIG_DICT and its own block's name from
NEMO_GYM_CONFIG_PATH, as every Gym server does; see genrm_trio.gym_server.
"""

import sys

from genrm_trio.gym_server import main

if __name__ == "__main__":
    sys.exit(main())
