package producer

import (
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLSTATEs a transaction pooler provokes in a client that caches prepared
// statements: the statement was prepared in another server session
// (invalid_sql_statement_name) or another client prepared one of the same
// name in this one (duplicate_prepared_statement).
const (
	sqlstateInvalidStatementName       = "26000"
	sqlstateDuplicatePreparedStatement = "42P05"
)

// statementCacheFix says what a prepared-statement error from behind a
// transaction pooler means and how to fix it.
const statementCacheFix = "a transaction pooler (PgBouncer pool_mode=transaction) runs each transaction in whichever server session is free, " +
	"and pgx's statement cache (its default QueryExecModeCacheStatement) prepares statements in one session and runs them in another; " +
	"create the pool with ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec (default_query_exec_mode=exec in the URL), " +
	"or use PgBouncer 1.21 or later with max_prepared_statements set"

// isStatementCacheErr reports whether err is a prepared-statement error of
// the kind a transaction pooler provokes in pgx's statement cache.
func isStatementCacheErr(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == sqlstateInvalidStatementName || pgErr.Code == sqlstateDuplicatePreparedStatement)
}

// migrateHint is the hint for an error of a statement on the SDK's
// tables: the pooler's statement cache problem when that is the cause,
// otherwise the question whether the tables exist at all.
func migrateHint(err error) string {
	if isStatementCacheErr(err) {
		return statementCacheFix
	}
	return "did Migrate run?"
}
