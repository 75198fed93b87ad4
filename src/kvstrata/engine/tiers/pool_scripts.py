"""The pool's Lua scripts: every decision about a key's version is taken inside Redis, atomically, per key.

A record's header (``kvstrata.engine.tiers.pool_record``) keeps the flags at byte 3 (bit 0: tombstone) and the
big-endian version at bytes 4..11, so ``GETRANGE key 0 11`` is all a script reads. Versions are compared byte by
byte (equal-length big-endian strings), never with Lua's locale-dependent string order.

Each write that changes a key publishes ``version (8 bytes) + kind (1 byte: 1 tombstone, 0 value) + pool key`` on
the invalidation channel, so every node drops its older local copy (docs/pool.md, "Invalidation").
"""

from __future__ import annotations

_HELPERS = """
local function newer(a, b)
  for i = 1, 8 do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x > y then return true end
    if x < y then return false end
  end
  return false
end
local head = redis.call('GETRANGE', KEYS[1], 0, 11)
local cur, tomb = nil, false
if #head == 12 and string.sub(head, 1, 2) == 'KP' then
  cur = string.sub(head, 5, 12)
  tomb = string.byte(head, 4) % 2 == 1
end
"""

# PUT (also a tombstone): ARGV = record, version, px, channel, message head (version + kind). Replaces the record unless the pool holds a version
# that is not lower (equal: the same write again, nothing to do). Returns 1, or the pool's version (refused).
SET_IF_NEWER = _HELPERS + """
if cur ~= nil and not newer(ARGV[2], cur) then
  if cur == ARGV[2] then return 1 end
  return cur
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[5] .. KEYS[1])
return 1
"""

# Compare-and-set: ARGV = record, version, px, channel, expected, fallback, message head. The key's current version is the
# pool's (0 for a tombstone), or ``fallback`` (the writer's local version) when the pool has no record at all
# (it expired there, or was never written while the pool was away). Returns 1, or {current} (refused).
CAS = _HELPERS + """
local have = ARGV[6]
if cur ~= nil then
  if tomb then have = '\\0\\0\\0\\0\\0\\0\\0\\0' else have = cur end
end
if have ~= ARGV[5] then return {have} end
if cur ~= nil and not newer(ARGV[2], cur) then return {cur} end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
redis.call('PUBLISH', ARGV[4], ARGV[7] .. KEYS[1])
return 1
"""

# Budget eviction: delete the record only if it is still the version this node wrote. ARGV = version.
DEL_IF_VERSION = """
local head = redis.call('GETRANGE', KEYS[1], 4, 11)
if head == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
