// Package entdb is the ent client of the ent example, generated from
// ./schema with the sql/execquery feature (which gives ent.Tx its
// ExecContext): go generate ./ent/entdb
package entdb

//go:generate go run -mod=mod entgo.io/ent/cmd/ent generate --feature sql/execquery ./schema
