// Package consumertest tests a consumer.Handler the way production will
// treat it: it feeds the handler's own sample records through a real
// consumer.Processor on a real PostgreSQL, redelivered, duplicated,
// reordered, delayed behind gaps, interrupted by restarts with lost
// offsets, with the handler's transaction failing after the handler ran
// (an error, a panic, a serialization failure) and some records
// dead-lettered and replayed by an operator, and then checks what the
// handler wrote.
//
//	func TestLedgerHandler(t *testing.T) {
//		dsn := os.Getenv("TEST_DATABASE_URL") // a database of your own
//		if dsn == "" {
//			t.Skip("set TEST_DATABASE_URL to run the handler's test")
//		}
//		pool, err := pgxpool.New(t.Context(), dsn)
//		if err != nil {
//			t.Fatal(err)
//		}
//		defer pool.Close()
//		consumertest.Run(t, consumertest.Config{
//			DB:      pool,
//			Handler: ledger{},
//			Records: consumertest.Records(sampleEvents()...), // producer.Events
//			Reset: func(ctx context.Context, db *pgxpool.Pool) error {
//				_, err := db.Exec(ctx, `TRUNCATE ledger`)
//				return err
//			},
//			Applied: func(ctx context.Context, db *pgxpool.Pool) ([]string, error) {
//				rows, _ := db.Query(ctx, `SELECT event_id FROM ledger ORDER BY id`)
//				return pgx.CollectRows(rows, pgx.RowTo[string])
//			},
//		})
//	}
//
// Records turns the events your service writes into the records the relay
// would publish (producer.Record, with ids and per-aggregate sequences as
// producer.Write gives them). Before anything runs, Check refuses sample
// records that no handler could pass, naming the record and the fix: one
// without an idempotency key, two that share one, a sequence header that
// is not a number from 1 or has no aggregate id, and an aggregate's
// records out of sequence order or with a hole.
//
// A run fails when, after every record was delivered and every dead
// letter replayed:
//
//   - an effect is missing or applied twice (Applied does not list every
//     record's idempotency key exactly once): typically a handler that
//     writes outside the transaction it is given, so that a rolled-back try
//     still leaves its effect, or one that keeps state in memory across
//     tries;
//   - an aggregate's effects are not in sequence order in Applied;
//   - a record stays dead-lettered or parked: the handler fails for it on
//     its own, or the record breaks the wire contract (the reason is in the
//     failure);
//   - ProcessBatch gave a different result from Process: Applied, or State
//     when it is set, differs. ProcessBatch calls a plain Handler for
//     several messages in one transaction, so this is where a Handle whose
//     effect depends on what else its transaction did shows. With a
//     consumer.BatchHandler, ProcessBatch
//     applies a batch through HandleBatch, so this is where a HandleBatch
//     that does not have exactly the effect of Handle for each message
//     shows. Because a drawn schedule may roll every batch back to one
//     record per transaction, a BatchHandler also gets a plain schedule
//     before the drawn ones: every record once, in order, in one batch,
//     without faults.
//
// Every run draws its schedule from a seed, printed in the failure
// together with the run; set OUTBOX_CONSUMERTEST_SEED (or [Config.Seed]) to
// it to replay exactly that schedule, and OUTBOX_CONSUMERTEST_RUNS to run
// more schedules than [Config.Runs].
//
// What it cannot see: effects outside the database (an email, an HTTP
// call), which the SDK does not cover either and which happen again on a
// retry; and whatever Applied and State do not report.
//
// The SDK's tables go into [Config.Schema], migrated by Run with
// outbox.Migrate (a fresh schema, dropped afterwards, when Schema is
// empty). Each schedule and mode uses a consumer name of its own, so the
// SDK's state starts empty; Reset must empty the handler's own tables.
package consumertest
