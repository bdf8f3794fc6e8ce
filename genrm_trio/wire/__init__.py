"""The wire layer, with no I/O: what /verify and /compare bodies become, their validation with the
exact error texts, the byte-exact rows and replies, and the documented shapes as msgspec types;
the same for /verify_group (``group_bodies``), NeMo Gym's session and metrics routes
(``gym_bodies``) and OpenRLHF's reward route (``openrlhf_bodies``).

Everything here is plain synchronous code over bytes, unit-tested without an event loop or a
server; ``genrm_trio.http`` serves it.
"""
