package postgresbench

import (
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
)

// BenchmarkEncodeEventIDs encodes the event ids of one Enqueue or Store of
// 100 messages the way pgx sends them (binary uuid[]), from the Go types
// omnibus could hand it: []uuid.UUID (what Enqueue passed before
// 2026-12-05), []*uuid.UUID (Store, before) and []pgtype.UUID (both now).
// pgx encodes the first two element by element through driver.Valuer and
// text; the last directly.
//
// Metrics: ns/op and allocs/op per 100 ids, per sub-benchmark.
func BenchmarkEncodeEventIDs(b *testing.B) {
	ids := make([]uuid.UUID, 100)
	for i := range ids {
		ids[i] = uuid.New()
	}
	ptrs := make([]*uuid.UUID, len(ids))
	typed := make([]pgtype.UUID, len(ids))
	for i := range ids {
		ptrs[i] = &ids[i]
		typed[i] = pgtype.UUID{Bytes: ids[i], Valid: true}
	}
	for _, tc := range []struct {
		name string
		v    any
	}{
		{"uuid.UUID", ids},
		{"*uuid.UUID", ptrs},
		{"pgtype.UUID", typed},
	} {
		b.Run(tc.name, func(b *testing.B) {
			m := pgtype.NewMap()
			buf := make([]byte, 0, 1<<12)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := m.Encode(pgtype.UUIDArrayOID, pgtype.BinaryFormatCode, tc.v, buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
