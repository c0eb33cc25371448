-- {{.Table}}: a relay that keeps a key for its next run (engine.next) takes
-- the key's advisory lock with a try in the middle of a batch. When a writer
-- of the key is in flight the try fails, and this function fails the
-- batch with lock_not_available, so nothing after it runs and the relay
-- gives the key back while it still holds it, as it did when the lock was a
-- row lock taken NOWAIT. (Giving up the lane's lease in the same statement
-- instead let the relay lease the key again before its give-back ran; the
-- give-back then saw the new run's rows leased and put the lane to sleep
-- for the length of a lease.)
CREATE OR REPLACE FUNCTION {{.Qualified "_lane_lock_fn"}}(lane_group text, lane_topic text, lane_key text) RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NOT pg_try_advisory_xact_lock({{.LaneLock "lane_group" "lane_topic" "lane_key"}}) THEN
        RAISE EXCEPTION 'a writer of the key is in flight' USING ERRCODE = 'lock_not_available';
    END IF;
    RETURN true;
END
$fn$;
