// Package schema is the ent schema of the ent example's orders table.
package schema

import (
	"entgo.io/ent"
	"entgo.io/ent/schema/field"
)

// Order is a business row written with its event.
type Order struct {
	ent.Schema
}

// Fields of Order.
func (Order) Fields() []ent.Field {
	return []ent.Field{
		field.String("id"),
		field.Int("amount"),
	}
}
