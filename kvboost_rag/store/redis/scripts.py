"""The server-side script that stores a chunk with its index entries in one step (atomic: a
reader never sees the chunk without its postings, or its postings without the chunk)."""

from __future__ import annotations

# KEYS: the chunk, then its prefix pointer when ARGV[4] == "1", then its window postings.
# ARGV: the value, the content hash (the postings' member), a TTL in seconds (0: none), has-prefix.
# Returns 1 when the chunk was written, 0 when it was there (its index entries are renewed: an
# allkeys-* eviction policy may have dropped some).
# NOTE: the shebang makes Redis (>= 7) refuse the whole script up front when out of memory, never
# half of it.
PUT_CHUNK = """#!lua
local written = 0
if redis.call('EXISTS', KEYS[1]) == 0 then
  if tonumber(ARGV[3]) > 0 then
    redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
  else
    redis.call('SET', KEYS[1], ARGV[1])
  end
  written = 1
end
local first = 2
if ARGV[4] == '1' then
  redis.call('SET', KEYS[2], ARGV[2])
  first = 3
end
for i = first, #KEYS do
  redis.call('SADD', KEYS[i], ARGV[2])
end
return written
"""

# KEYS: the chunk, its prefix pointer when ARGV[2] == "1", its window postings. ARGV[1]: the
# content hash. Removes the chunk and every index entry naming it, in one step.
REMOVE_CHUNK = """#!lua
redis.call('DEL', KEYS[1])
local first = 2
if ARGV[2] == '1' then
  if redis.call('GET', KEYS[2]) == ARGV[1] then redis.call('DEL', KEYS[2]) end
  first = 3
end
for i = first, #KEYS do
  redis.call('SREM', KEYS[i], ARGV[1])
end
return 1
"""

# KEYS: a document's claim. ARGV: the writer, the claim's life in milliseconds, a holder whose
# claim may be taken over (its writer is gone; "" for none). Returns 1 when the writer holds the
# claim now (taken, or its own renewed), else the writer whose claim stands.
CLAIM_DOCUMENT = """#!lua
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] and holder ~= ARGV[3] then return holder end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# KEYS: a document's claim. ARGV: the writer. Frees the claim if that writer holds it.
RELEASE_DOCUMENT = """#!lua
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""
