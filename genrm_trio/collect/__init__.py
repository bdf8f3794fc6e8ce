"""`genrm-trio collect`: evaluation runs that generate rollouts with a policy, have a genrm-trio
server judge each task's rollouts as one whole group, and write rows, failures and metrics."""
