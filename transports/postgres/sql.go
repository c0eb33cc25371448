package postgres

import (
	"embed"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/omnibus-go/omnibus/internal/sqlfile"
)

// Every SQL statement of the transport lives in the named blocks of the
// files in sql/ (the migrations, versioned templates of their own, live in
// migrations/). They are parsed once, when the package is initialised, and
// each component renders the ones it runs for its table when it is
// constructed.
//
//go:embed sql/*.sql
var sqlFS embed.FS

var statements = sqlfile.MustParse(sqlFS, "sql")

// The placeholders of the statements. The table's names are the only values
// that come from outside, and they are validated and quoted (ident.go); every
// other placeholder is one of two fixed texts, chosen by whether the table is
// an inbox (whose rows carry a consumer group; an outbox's rows do not, and
// its lanes all belong to the empty group) and whether an Admin is restricted to
// one consumer group.
//
//	{T} {L} {N} {M} the table, its lanes table, its lane notes table, the
//	                migrations bookkeeping table of its schema (quoted)
//	{D}             the partitioned layout's dedup table (quoted)
//	{PARTITION_INTERVAL_FN} {DEDUP_FN} {CREATED_FN}  the partitioned layout's functions
//	{P}             partitions.go: one partition (quoted), per call
//	{LANE_FN} {NOTIFY_FN}  its trigger functions (quoted, schema-qualified)
//	{LANE_LOCK_FN}  its function that takes a lane's lock or fails (migration 0005)
//	{LANE_LOCK}     the two arguments of the advisory lock of the lane ($1, $2,
//	                $3) = (group, topic, key), computed as the lane trigger does
//	{LANE_LOCK_C} {LANE_LOCK_K}  the same for the lane c / k (rows of {L})
//	{G_T} {G_F}     engine, inbox: rows t / f belong to the group of lane
//	{G_TK} {G_FK}   engine, inbox: rows t / f belong to the group of k
//	{G_TKG}         engine, inbox: rows t belong to the group k.g
//	{GP_T}          engine: rows t belong to the group $9 (outbox: $9 is '')
//	{SWEEPGROUP}    engine: the group of a row t ('' for the outbox)
//	{GROUP_T} {GROUP_L}  Admin of one group: rows t / lanes l are @group's
//	{GL_T}          admin, inbox: rows t belong to the group of lane l
//	{GCOL} {MSGID}  admin: a row's group and message id ('' for the outbox)
//	{COMPLETED}     console: the CompletedCapped or CompletedNotCounted fragment
//	{KEY_COUNTS}    admin, console: the KeyCounts fragment
//	{LANE_RUNS}     admin, console: the LaneRuns fragment
//	{LOST_RUN} {LEASE_TAKEN}  engine: the LostRun and LeaseTaken fragments (LeaseLanes, LeaseLane)
//	{RUN_ROWS}      admin, console: the RunRows fragment (LaneRuns, Leases)
//	{LOST_ROWS}     engine, admin: the LostRows fragment (LostRun, ReleaseExpiredLanes)
//	{FILTER}        admin: where a FailedFilter's conditions go, per call
//	{SCHEMA}        CreateSchema: the table's schema (quoted)
//	{CHANNEL}       Listen, Unlisten: a table's channel (quoted)
type vocab struct {
	t       tableName
	inbox   bool
	byGroup bool
}

// filterMark is what {FILTER} renders to when a component is built; each call
// replaces it with the conditions of its FailedFilter.
const filterMark = "/* filter */"

// replacer returns the values of every placeholder for v.
func (v vocab) replacer() *strings.Replacer { return strings.NewReplacer(v.pairs()...) }

// pairs is every placeholder for v and its value, as strings.NewReplacer
// takes them.
func (v vocab) pairs() []string {
	t := v.t
	kv := []string{
		"{T}", t.quoted(),
		"{L}", t.derived("_lanes").quoted(),
		"{N}", t.derived("_notes").quoted(),
		"{D}", t.derived("_dedup").quoted(),
		"{PARTITION_INTERVAL_FN}", t.qualifiedIdent("_interval_fn"),
		"{DEDUP_FN}", t.qualifiedIdent("_dedup_fn"),
		"{CREATED_FN}", t.qualifiedIdent("_created_fn"),
		"{M}", migrationsBook(t),
		"{LANE_FN}", t.qualifiedIdent("_lane_fn"),
		"{LANE_LOCK_FN}", t.qualifiedIdent("_lane_lock_fn"),
		"{NOTIFY_FN}", t.qualifiedIdent("_notify_fn"),
		"{LANE_LOCK}", laneLock(t, "$1", "$2", "$3"),
		"{LANE_LOCK_K}", laneLock(t, "k.consumer_group", "k.topic", "k.partition_key"),
		"{LANE_LOCK_C}", laneLock(t, "c.consumer_group", "c.topic", "c.partition_key"),
		"{FILTER}", filterMark,
	}
	if t.schema != "" {
		kv = append(kv, "{SCHEMA}", quoteIdent(t.schema))
	}
	var gt, gf, gtk, gfk, gtkg string
	gpt, sweep := " AND $9::text = ''", "''" // outbox rows all belong to the group ''
	var groupT, groupL, glt string
	gcol, msgid := "''::text", "''::text"
	if v.inbox {
		gt, gf = " AND t.consumer_group = lane.consumer_group", " AND f.consumer_group = lane.consumer_group"
		gtk, gfk = " AND t.consumer_group = k.consumer_group", " AND f.consumer_group = k.consumer_group"
		gtkg, gpt, sweep = " AND t.consumer_group = k.g", " AND t.consumer_group = $9", "t.consumer_group"
		glt, gcol, msgid = " AND t.consumer_group = l.consumer_group", "t.consumer_group", "t.message_id"
		if v.byGroup {
			groupT, groupL = " AND t.consumer_group = @group", " AND l.consumer_group = @group"
		}
	}
	kv = append(kv,
		"{G_T}", gt, "{G_F}", gf, "{G_TK}", gtk, "{G_FK}", gfk, "{G_TKG}", gtkg,
		"{GP_T}", gpt, "{SWEEPGROUP}", sweep,
		"{GROUP_T}", groupT, "{GROUP_L}", groupL, "{GL_T}", glt, "{GCOL}", gcol, "{MSGID}", msgid,
	)
	completed := "CompletedCapped"
	if v.byGroup {
		completed = "CompletedNotCounted"
	}
	fragments := strings.NewReplacer(kv...)
	// RunRows goes into LaneRuns and LostRows into LostRun, so they are
	// rendered first.
	kv = append(kv, "{RUN_ROWS}", fragments.Replace(statements.Block("RunRows").SQL),
		"{LOST_ROWS}", fragments.Replace(statements.Block("LostRows").SQL))
	fragments = strings.NewReplacer(kv...)
	kv = append(kv,
		"{COMPLETED}", fragments.Replace(statements.Block(completed).SQL),
		"{KEY_COUNTS}", fragments.Replace(statements.Block("KeyCounts").SQL),
		"{LANE_RUNS}", fragments.Replace(statements.Block("LaneRuns").SQL),
		"{LOST_RUN}", fragments.Replace(statements.Block("LostRun").SQL),
		"{LEASE_TAKEN}", fragments.Replace(statements.Block("LeaseTaken").SQL))
	return kv
}

// renderer renders named statements for one vocab, with one replacer.
type renderer struct{ r *strings.Replacer }

func (v vocab) renderer() renderer { return renderer{v.replacer()} }

// sql renders the statement called name; it panics when no file defines it.
func (r renderer) sql(name string) string { return statements.Render(name, r.r) }

// fixedSQL is a statement without placeholders.
func fixedSQL(name string) string { return statements.Render(name, nil) }

// channelSQL renders Listen or Unlisten for a channel.
func channelSQL(name, channel string) string {
	return statements.Render(name, strings.NewReplacer("{CHANNEL}", quoteIdent(channel)))
}

// migrationsBook is the quoted bookkeeping table of t's schema, the one
// Migrate records applied versions in.
func migrationsBook(t tableName) string {
	return tableName{schema: t.schema, name: "omnibus_schema_migrations"}.quoted()
}

// laneLockBuckets is how many advisory locks the lanes of one table share.
// A transaction that enqueues rows of many keys holds at most this many
// (PostgreSQL's lock table has room for max_locks_per_transaction ×
// max_connections, 6,400 by default, across all sessions); two keys that
// share a lock only make a writer of one wait for a relay's short fetch of
// the other.
const laneLockBuckets = 1024

// laneLock is the two int4 arguments of the advisory lock of a lane, the
// expressions g, topic and key being its group, topic and partition key:
// a number for the table and the lane's bucket. Writers hold it shared (the
// lane trigger, migration 0004), relays exclusively while they read the
// lane's rows. The two-argument form keeps clear of the single bigint keys
// applications use for their own advisory locks.
func laneLock(t tableName, g, topic, key string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(t.String()))
	return fmt.Sprintf("%d, (hashtextextended(%s || '|' || %s || '|' || %s, 0) & %d)::int",
		int32(h.Sum32()), g, topic, key, laneLockBuckets-1)
}
