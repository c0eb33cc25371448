-- {{.Lanes}}: each lane's floor. No row of the lane with an id below
-- floor_id is pending. When a relay gives a lane back it moves the floor up
-- to the lane's first pending row, at most one past the last row its fetch
-- handed out (every id up to that one existed while the fetch held the lane
-- locked against writers, so none below can appear later), and every lookup
-- of the lane's rows starts there instead of walking the rows the key
-- completed before, whatever plan the statistics pick. Requeueing a failed
-- row moves the floor back down to it.
ALTER TABLE {{.Lanes}} ADD COLUMN IF NOT EXISTS floor_id bigint NOT NULL DEFAULT 0;
