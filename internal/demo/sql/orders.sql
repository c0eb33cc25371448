-- The demo's own business table (`omnibus demo`): the orders whose changes
-- the demo writes together with their events, and to which its handlers apply
-- each event. It plays the part of a service's table; omnibus's tables are
-- reached through postgres.Migrate, Drop and Admin only. {ORDERS} is the
-- table's name, quoted.

-- name: CreateOrders
CREATE TABLE {ORDERS} (id text PRIMARY KEY, status text NOT NULL, handled text[] NOT NULL DEFAULT '{}')

-- name: DropOrders
DROP TABLE IF EXISTS {ORDERS} CASCADE

-- name: UpsertOrder
-- The service's change, written in the transaction that enqueues its event.
INSERT INTO {ORDERS} (id, status) VALUES ($1, $2)
ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status

-- name: AppendHandled
-- A handler's effect, in the transaction that completes the inbox row.
UPDATE {ORDERS} SET handled = array_append(handled, $2) WHERE id = $1

-- name: ListOrders
SELECT id, handled FROM {ORDERS} ORDER BY id
