"""What tests of kvboost-rag and of the framework packages share, shipped so that each package's
tests run from an installed wheel as from this repository: stand-ins for the engine (`fakes`), a
throwaway redis-server (`redis_server`, needs the `redis` extra and Debian's redis-server), one
model for a whole test session and `kvboost-rag warm` run as a user runs it (`engines`).

Nothing here is imported by the product itself.
"""
