"""The wire layer, with no I/O: what /verify and /compare bodies become, their validation with the
exact error texts, the byte-exact rows and replies, and the documented shapes as msgspec types.

Everything here is plain synchronous code over bytes, unit-tested without an event loop or a
server; ``genrm_trio.http`` serves it.
"""
