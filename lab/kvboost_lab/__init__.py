"""kvboost-rag's lab: what measures the product and is not shipped with it.

`harness` is what every script in benchmarks/ shares, `tables` renders their JSON as the
READMEs' tables, `redis_server` runs a throwaway redis-server for tests and benchmarks.
"""
