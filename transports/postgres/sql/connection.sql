-- Statements about the connection or transaction rather than a table.

-- name: SetLockTimeout
-- Bounds the lock waits of the current transaction ($1 is a duration such as
-- '200ms'); set_config(..., true) is SET LOCAL with a parameter.
SELECT set_config('lock_timeout', $1, true)

-- name: Notify
-- Wakes the relays listening on a table's channel ($1). Delivered only if the
-- transaction commits.
SELECT pg_notify($1, '')

-- name: Listen
-- {CHANNEL} is a table's channel, quoted as an identifier.
LISTEN {CHANNEL}

-- name: Unlisten
UNLISTEN {CHANNEL}
