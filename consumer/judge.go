package consumer

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// prober is what judge asks SELECT 1: a pool, or a live transaction.
type prober interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// probeTimeout bounds the probe that judge sends: a database that cannot
// answer SELECT 1 within it is not serving other work.
const probeTimeout = 5 * time.Second

// judge turns the class of err, a record's failed try, into classRecord or
// classTransient when it is classSuspect: a statement timeout, a lock
// timeout, a deadlock or a lost connection in the handler's own work,
// which a sick record and an outage both cause. It asks the database on
// probe, which is the Processor's pool after a try whose transaction
// ended, and the draining transaction itself for a parked record's try in
// a drain: that transaction is alive after the rollback to its savepoint,
// and a busy pool (two connections, or PgBouncer's pool_size 1) may have
// no second connection to give while the drain holds one, which must not
// be mistaken for an outage. When the database answers, it serves other
// work and the failure is the record's: its try counts toward
// [Config.MaxAttempts], so a record whose handler times out every time
// ends as a dead letter instead of being handed back for ever. When it does not answer, that is
// an outage: nothing counts, nothing is dead-lettered, and the log says
// so. Other classes pass through unchanged; a pooler's error is logged
// with its fix.
func (p *Processor) judge(ctx context.Context, probe prober, class errClass, err error, m *Message) errClass {
	if isPooler(err) && !isInfra(err) {
		attrs := []any{slog.String("topic", m.Topic), slog.Int("partition", int(m.Partition)), slog.Int64("offset", m.Offset),
			slog.String("error", err.Error())}
		if p.pooler.seen(m, p.cfg.ContentionSpan) {
			p.log.WarnContext(ctx, "consumer: a connection pooler lost a prepared statement; the record is not blamed. Behind PgBouncer in transaction mode use pgx's exec or describe-exec mode (default_query_exec_mode=exec in the connection string), or PgBouncer 1.21+ with max_prepared_statements: see docs/deployment.md", attrs...)
			return classTransient
		}
		p.log.WarnContext(ctx, "consumer: the handler got a prepared-statement or protocol error that no other record got lately; it counts against the record (a pooler's fault shows in other records too: see docs/deployment.md)", attrs...)
		return classRecord
	}
	if class != classSuspect {
		return class
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var one int
	perr := probe.QueryRow(pctx, "SELECT 1").Scan(&one)
	if perr == nil {
		return classRecord
	}
	if ctx.Err() == nil {
		p.log.WarnContext(ctx, "consumer: database not answering; the record's failure is not counted against it and nothing is dead-lettered until it answers again",
			slog.String("topic", m.Topic), slog.Int("partition", int(m.Partition)), slog.Int64("offset", m.Offset),
			slog.String("error", err.Error()), slog.String("probe_error", perr.Error()))
	}
	return classTransient
}

// riding reports whether err, a failure judged the record's, is one that
// contention or a failover also causes (classSuspect) while
// [Config.ContentionSpan] since the first of them in a row, *since, is not
// over: the record is then tried again although its tries reached
// MaxAttempts. It sets *since at the first such failure and clears it at
// any other.
func (p *Processor) riding(since *time.Time, err error) bool {
	if classify(err) != classSuspect || p.cfg.ContentionSpan < 0 {
		*since = time.Time{}
		return false
	}
	now := time.Now()
	if since.IsZero() {
		*since = now
	}
	return now.Sub(*since) < p.cfg.ContentionSpan
}

// poolerSeen remembers the last record whose handler got a pooler's
// SQLSTATE (poolerStates), and when another record last did, so that
// judge can tell a pooler's fault, which other records see too, from a
// handler's own, which one record sees on every try. Any goroutine
// touches it under mu.
type poolerSeen struct {
	mu sync.Mutex
	// last got one at at; another record got one at other.
	last      recordAt
	at, other time.Time
}

// recordAt names a record by its place.
type recordAt struct {
	topic     string
	partition int32
	offset    int64
}

// seen notes that m's handler got a pooler's error and reports whether
// another record's did within span (a minute when span is negative).
func (s *poolerSeen) seen(m *Message, span time.Duration) bool {
	if span < 0 {
		span = time.Minute
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now, here := time.Now(), recordAt{m.Topic, m.Partition, m.Offset}
	if here != s.last {
		s.other, s.last = s.at, here
	}
	s.at = now
	return !s.other.IsZero() && now.Sub(s.other) < span
}
