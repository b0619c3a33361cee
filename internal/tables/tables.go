package tables

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// placeholder is where a statement names its schema.
const placeholder = "{schema}"

// Consumer holds the statements of the consumer's tables in one schema.
type Consumer struct {
	Keys        Keys
	Positions   Positions
	Parked      Parked
	DeadLetters DeadLetters
	HotPath     HotPath
}

// For returns the statements with schema written in, quoted.
func For(schema string) *Consumer {
	r := strings.NewReplacer(placeholder, pgx.Identifier{schema}.Sanitize())
	q := r.Replace
	return &Consumer{
		Keys:        keys(q),
		Positions:   positions(q),
		Parked:      parked(q),
		DeadLetters: deadLetters(q),
		HotPath:     hotPath(q),
	}
}
