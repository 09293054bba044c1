"""kvboost-rag's lab: what measures the product and is not shipped with it.

`harness` is what every script in benchmarks/ shares, `tables` renders their JSON as the
READMEs' tables, `http_server` runs the server for benchmarks (a throwaway redis-server and the
fakes tests use ship with the product, in `kvboost_rag.testing`, for the packages' tests).
"""
