package consumer

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	pg := func(code string) error { return &pgconn.PgError{Code: code} }
	tests := []struct {
		name string
		err  error
		want errClass
	}{
		{"HandlerError", errors.New("downstream broken"), classRecord},
		{"HandlerUniqueViolation", pg("23505"), classRecord},
		{"HandlerDataError", pg("22P02"), classRecord},
		{"Serialization", pg("40001"), classTransient},
		{"Deadlock", fmt.Errorf("wrapped: %w", pg("40P01")), classTransient},
		{"LockTimeout", pg("55P03"), classTransient},
		{"StatementTimeout", pg("57014"), classTransient},
		{"AdminShutdown", pg("57P01"), classTransient},
		{"CrashShutdown", pg("57P02"), classTransient},
		{"CannotConnectNow", pg("57P03"), classTransient},
		{"ConnectionException", pg("08006"), classTransient},
		{"TooManyConnections", pg("53300"), classTransient},
		{"ReadOnlyAfterSwitchover", pg("25006"), classTransient},
		{"OwnStatementFailed", infra(errors.New("conn reset")), classTransient},
		{"OwnStatementLockTimeout", infra(pg("55P03")), classTransient},
		{"OwnStatementIndexRowTooBig", infra(pg("54000")), classData},
		{"OwnStatementOutOfRange", infra(pg("22003")), classData},
		{"Timeout", &HandlerTimeoutError{Err: context.DeadlineExceeded}, classRecord},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, classify(tt.err))
		})
	}
}
