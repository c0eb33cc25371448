package postgres

// The statements each component runs, rendered for its table once, when the
// component is constructed. Their SQL is in sql/ (see sql.go); the comments
// there say what each does and why.

// queries holds the statements of the writers and of the delivery engine for
// one outbox or inbox table.
type queries struct {
	table   tableName
	inbox   bool
	channel string

	insertOutbox string // outbox only
	insertInbox  string // inbox only
	removeInbox  string // inbox only
	leaseLanes   string
	pick         string
	takeNotes    string
	laneLock     string
	leaseLane    string
	keepLane     string
	bookkeeping  string
	generic      string
	indexPlans   string
	settlePlans  string
	planJoins    string
	starved      string
	settle       string
	lockLanes    string
	ownedLanes   string
	reconcile    string
	lockEmpty    string
	deleteEmpty  string
	readyLanes   string
	extendRows   string
	extendLanes  string
	sweep        string
	vacuum       string
	deadVersions string
	compactLanes string
	compactNotes string
	vacuumedAgo  string
	completeRow  string
	lockTimeout  string
	notify       string
}

func newQueries(t tableName, inbox bool) *queries {
	r := vocab{t: t, inbox: inbox}.renderer()
	q := &queries{
		table:        t,
		inbox:        inbox,
		channel:      t.channel(),
		leaseLanes:   r.sql("LeaseLanes"),
		pick:         r.sql("Pick"),
		takeNotes:    r.sql("TakeNotes"),
		laneLock:     r.sql("LaneLock"),
		leaseLane:    r.sql("LeaseLane"),
		keepLane:     r.sql("KeepLane"),
		bookkeeping:  r.sql("Bookkeeping"),
		generic:      r.sql("GenericPlans"),
		indexPlans:   r.sql("IndexPlans"),
		settlePlans:  r.sql("SettlePlans"),
		planJoins:    r.sql("PlanJoins"),
		starved:      r.sql("StarvedLanes"),
		settle:       r.sql("Settle"),
		lockLanes:    r.sql("LockLanes"),
		ownedLanes:   r.sql("OwnedLanes"),
		reconcile:    r.sql("Reconcile"),
		lockEmpty:    r.sql("LockEmptyLanes"),
		deleteEmpty:  r.sql("DeleteEmptyLanes"),
		readyLanes:   r.sql("ReadyLanes"),
		extendRows:   r.sql("ExtendRows"),
		extendLanes:  r.sql("ExtendLanes"),
		sweep:        r.sql("SweepLanes"),
		vacuum:       r.sql("VacuumLanes"),
		deadVersions: r.sql("DeadVersions"),
		compactLanes: r.sql("CompactLanes"),
		compactNotes: r.sql("CompactNotes"),
		vacuumedAgo:  r.sql("LanesVacuumedSince"),
		completeRow:  r.sql("CompleteRow"),
		lockTimeout:  r.sql("SetLockTimeout"),
		notify:       r.sql("Notify"),
	}
	if inbox {
		q.insertInbox = r.sql("InsertInbox")
		q.removeInbox = r.sql("RemoveInbox")
	} else {
		q.insertOutbox = r.sql("InsertOutbox")
	}
	return q
}

// adminQueries holds the statements of Admin and of the console for one
// table, for every consumer group or (byGroup) for one. They take named
// arguments (pgx.NamedArgs).
type adminQueries struct {
	stats         string
	health        string
	listFailed    string // {FILTER} rendered as filterMark
	failedCeiling string
	requeue       string
	releaseRows   string
	releaseLanes  string
	cleanupCutoff string
	cleanup       string
	countCleanup  string
	row           string
	overview      string
	heldKeys      string
	leases        string
	throughput    string
	countFailed   string // {FILTER} rendered as filterMark
	groups        string // inbox only
	lane          string
	discard       string
	schemaObjects string
	schemaVersion string

	// The conditions of a FailedFilter (FailedFilter.conditions).
	filterTopic, filterKey, filterErr, filterFrom, filterTo string
}

func newAdminQueries(t tableName, inbox, byGroup bool) *adminQueries {
	r := vocab{t: t, inbox: inbox, byGroup: byGroup}.renderer()
	q := &adminQueries{
		stats:         r.sql("Stats"),
		health:        r.sql("Health"),
		listFailed:    r.sql("ListFailed"),
		failedCeiling: r.sql("FailedCeiling"),
		requeue:       r.sql("RequeueFailed"),
		releaseRows:   r.sql("ReleaseExpiredRows"),
		releaseLanes:  r.sql("ReleaseExpiredLanes"),
		cleanupCutoff: r.sql("CleanupCutoff"),
		cleanup:       r.sql("Cleanup"),
		countCleanup:  r.sql("CountCompletedOlderThan"),
		row:           r.sql("Row"),
		overview:      r.sql("Overview"),
		heldKeys:      r.sql("HeldKeys"),
		leases:        r.sql("Leases"),
		throughput:    r.sql("Throughput"),
		countFailed:   r.sql("CountFailed"),
		lane:          r.sql("Lane"),
		discard:       r.sql("Discard"),
		schemaObjects: r.sql("SchemaObjects"),
		schemaVersion: r.sql("AppliedVersion"),
		filterTopic:   " " + r.sql("FilterTopic"),
		filterKey:     " " + r.sql("FilterPartitionKey"),
		filterErr:     " " + r.sql("FilterErrorContains"),
		filterFrom:    " " + r.sql("FilterCreatedFrom"),
		filterTo:      " " + r.sql("FilterCreatedBefore"),
	}
	if inbox {
		q.groups = r.sql("ConsumerGroups")
	}
	return q
}
