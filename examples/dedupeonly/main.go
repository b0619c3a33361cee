// Command dedupeonly uses package dedupe on its own, without Kafka: a
// payment provider calls a webhook at least once, and the service credits
// each payment once by claiming the webhook's id in the same transaction as
// the credit.
//
//	go run ./examples/dedupeonly
//
// PostgreSQL comes from DATABASE_URL, or else a throwaway cluster started
// from the machine's binaries.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/dedupe"
	"github.com/d419a114/outbox/internal/localenv"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "dedupeonly:", err)
		os.Exit(1)
	}
}

const schema = "dedupeonly_example"

// webhook is what the provider sends; it resends on timeouts, so the same
// id can arrive several times, even concurrently.
type webhook struct {
	ID      string
	Account string
	Cents   int64
}

func run(ctx context.Context, out io.Writer) error {
	dbURL, stopDB, err := localenv.Database()
	if err != nil {
		return err
	}
	defer stopDB()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+schema+` CASCADE`); err != nil {
		return err
	}
	quiet := slog.New(slog.DiscardHandler)
	if _, err := outbox.Migrate(ctx, pool, &outbox.MigrateConfig{Schema: schema, Logger: quiet}); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE `+schema+`.balances (account text PRIMARY KEY, cents bigint NOT NULL)`); err != nil {
		return err
	}

	store, err := dedupe.New("payments-webhook", &dedupe.Config{Schema: schema, Retention: 30 * 24 * time.Hour})
	if err != nil {
		return err
	}
	credit := func(w webhook) (bool, error) {
		fresh := false
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			if fresh, err = store.Claim(ctx, tx, w.ID); err != nil || !fresh {
				return err
			}
			_, err = tx.Exec(ctx, `INSERT INTO `+schema+`.balances VALUES ($1, $2)
ON CONFLICT (account) DO UPDATE SET cents = balances.cents + EXCLUDED.cents`, w.Account, w.Cents)
			return err
		})
		return fresh, err
	}

	deliveries := []webhook{
		{"pay_1", "alice", 500}, {"pay_2", "bob", 250},
		{"pay_1", "alice", 500}, // a resend after a timeout
		{"pay_3", "alice", 100},
		{"pay_2", "bob", 250}, // and another
	}
	for _, w := range deliveries {
		fresh, err := credit(w)
		if err != nil {
			return err
		}
		verdict := "credited"
		if !fresh {
			verdict = "duplicate, ignored"
		}
		fmt.Fprintf(out, "%s %s %d: %s\n", w.ID, w.Account, w.Cents, verdict)
	}

	rows, err := pool.Query(ctx, `SELECT account || '=' || cents FROM `+schema+`.balances ORDER BY account`)
	if err != nil {
		return err
	}
	balances, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "balances:", balances)

	// Run this periodically: keys older than the retention window go, in
	// bounded batches. Nothing is old enough yet.
	n, err := store.Prune(ctx, pool)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "pruned keys:", n)
	return nil
}
