package move

import (
	"fmt"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/internal/tables"
)

// statementsFor returns the move's statements on schema (default
// outbox.DefaultSchema).
func statementsFor(schema string) (tables.Moves, error) {
	if schema == "" {
		schema = outbox.DefaultSchema
	}
	if err := tables.CheckSchema(schema); err != nil {
		return tables.Moves{}, fmt.Errorf("move: %w", err)
	}
	return tables.MovesFor(schema), nil
}
