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
		{"Serialization", pg("40001"), classSuspect},
		{"Deadlock", fmt.Errorf("wrapped: %w", pg("40P01")), classSuspect},
		{"LockTimeout", pg("55P03"), classSuspect},
		{"StatementTimeout", pg("57014"), classSuspect},
		{"AdminShutdown", pg("57P01"), classSuspect},
		{"CrashShutdown", pg("57P02"), classSuspect},
		{"CannotConnectNow", pg("57P03"), classSuspect},
		{"ConnectionException", pg("08006"), classSuspect},
		{"TooManyConnections", pg("53300"), classSuspect},
		{"ReadOnlyAfterSwitchover", pg("25006"), classSuspect},
		{"OwnStatementFailed", infra(errors.New("conn reset")), classTransient},
		{"OwnStatementLockTimeout", infra(pg("55P03")), classTransient},
		{"OwnStatementIndexRowTooBig", infra(pg("54000")), classData},
		{"OwnStatementOutOfRange", infra(pg("22003")), classData},
		{"Timeout", &HandlerTimeoutError{Err: context.DeadlineExceeded}, classRecord},
		{"TimeoutCancelledByTheServer", &HandlerTimeoutError{Err: pg("57014")}, classRecord},
		{"OwnStatementTimeout", infra(pg("57014")), classTransient},
		{"PoolerDuplicateStatement", pg("42P05"), classSuspect},
		{"PoolerMissingStatement", fmt.Errorf("wrapped: %w", pg("26000")), classSuspect},
		{"PoolerProtocolViolation", pg("08P01"), classSuspect},
		{"OwnStatementPooler", infra(pg("26000")), classTransient},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tt.want, classify(tt.err))
		})
	}
}
