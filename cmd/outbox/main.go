// Command outbox applies the SDK's migrations and helps operate the
// outbox and its consumers from a shell.
//
//	outbox migrate [-schema outbox] [-partition-by-day]
//	outbox sql                              print the migrations, in order
//	outbox sql -roles [-schema outbox]      print the least-privilege roles
//	outbox health [-o table|json]           the producer's backlog
//	outbox dead list|replay|discard         the producer's dead events
//	outbox consumers [-o table|json]        what each consumer set aside
//	outbox letters list|show|replay|discard a consumer's dead letters
//	outbox gaps list|resolve                a consumer's open gaps
//	outbox requests [-consumer C]           operator requests and their outcome
//	outbox requests cancel ID               cancel a pending or running request
//	outbox moves [-o table|json]              moves recorded on the shards
//	outbox move start|resume|status         move aggregates between shards
//	outbox dashboard [-listen 127.0.0.1:8080]
//
// Replaying or discarding a consumer's letters, and resolving its gaps,
// needs its handler: the command submits a request (package operator) that
// the running consumer carries out, and -wait follows it to its end.
//
// The database comes from -database or DATABASE_URL. Exit codes: 0 done, 1
// the command could not run, 2 a wrong command line, 3 not found, 4 the
// action failed, 5 -wait ran out with the request still going on.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"os/user"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/consumer"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "outbox:", safe(err.Error()))
	}
	stop()
	os.Exit(exitCode(err))
}

// usage is the command line's help; its reasons are deadletter.Reasons.
var usage = `usage:
  outbox migrate [-schema outbox] [-partition-by-day] [-fleet FILE]
  outbox sql [-roles]
  outbox health [-o table|json]
  outbox dead list [-status dead|replayed|discarded|all] [-aggregate-type T] [-aggregate-id ID] [-o table|json]
  outbox dead replay|discard ID
  outbox consumers [-key-retention 168h] [-o table|json]
  outbox letters list [FILTER] [-status dead|replayed|discarded|all] [-after ID] [-limit N] [-group] [-o table|json]
  outbox letters show [-o table|json] ID
  outbox letters replay|discard [-wait D] [-by NAME] ID
  outbox letters replay|discard -consumer C [FILTER | -all] [-dry-run] [-rate N] [-wait D] [-by NAME]
  outbox gaps list [-consumer C] [-o table|json]
  outbox gaps resolve -consumer C -aggregate-type T -aggregate-id ID [-wait D] [-by NAME]
  outbox requests [-consumer C] [-limit N] [-o table|json]
  outbox requests cancel [-by NAME] ID
  outbox moves [-limit N] [-o table|json]
  outbox move start -fleet FILE -from SHARD -to SHARD (-aggregate TYPE/ID ... | -aggregates FILE) [-id ID] [-allow-new]
  outbox move resume|status -fleet FILE -from SHARD -to SHARD ID
  outbox dashboard [-listen 127.0.0.1:8080] [-fleet FILE]
FILTER: -consumer C -topic T -aggregate-type T -aggregate-id ID -reason R -failure F -since D -until D
  (-since/-until: a duration ago, such as 2h, or an RFC 3339 time; -reason: ` + reasonNames() + `)
Every command takes -schema (default outbox) and -database (default $DATABASE_URL).
Fleet: health, dead list, consumers, letters list, gaps list, requests and moves take -fleet FILE
  (or -database repeated) and answer per shard, 8 shards at once, each within -shard-timeout;
  producer commands read the file's "shards", consumer commands its "targets". Commands that
  change data take -fleet with -shard NAME. A shard that did not answer exits 1.
  migrate -fleet migrates every shard and target; dashboard -fleet serves the fleet overview.
Exit codes: 0 done, 1 could not run, 2 usage, 3 not found, 4 the action failed, 5 -wait ran out.`

var errUsage = errors.New(usage)

// usageError is a wrong command line: what is wrong, then the usage.
func usageError(format string, args ...any) error {
	return fmt.Errorf("%s\n%w", fmt.Sprintf(format, args...), errUsage)
}

// whoami is the default actor: $USER, else the account the process runs
// as, else "".
func whoami() string {
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return ""
}

// subcommands are the commands that take a verb.
var subcommands = map[string]bool{"dead": true, "letters": true, "gaps": true, "move": true}

// run executes one command line; it is main without the process around it.
func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		return errUsage
	}
	if args[0] == "help" || args[0] == "-h" || args[0] == "--help" || args[0] == "-help" {
		_, err := fmt.Fprintln(out, usage)
		return err
	}
	cmd, args := args[0], args[1:]
	if subcommands[cmd] {
		if len(args) == 0 || strings.HasPrefix(args[0], "-") {
			return usageError("%s needs a verb", cmd)
		}
		cmd, args = cmd+" "+args[0], args[1:]
	}
	// requests lists without a verb, and cancels with one.
	if cmd == "requests" && len(args) > 0 && args[0] == "cancel" {
		cmd, args = "requests cancel", args[1:]
	}
	o, err := parse(cmd, args)
	if errors.Is(err, flag.ErrHelp) {
		_, err := fmt.Fprint(out, commandHelp(cmd))
		return err
	}
	if err != nil {
		return err
	}
	if cmd == "sql" && o.roles {
		return printRoles(out, o.schema)
	}
	if cmd == "sql" {
		return printSQL(out)
	}
	if strings.HasPrefix(cmd, "move ") {
		return moveCommand(ctx, cmd, o, out)
	}
	h, ok := handlers[cmd]
	if !ok {
		return usageError("unknown command %q", cmd)
	}
	if done, err := inFleet(ctx, cmd, o, out); done {
		return err
	}
	if o.database == "" {
		return withCode(exitUsage, errors.New("no database: set DATABASE_URL or pass -database"))
	}
	pool, err := pgxpool.New(ctx, o.database)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	reads, err := consumer.NewInspector(pool, o.schema)
	if err != nil {
		return err
	}
	e := &env{pool: pool, db: pool, reads: reads, opts: o, out: out, cmd: cmd}
	if cmd != "migrate" {
		if err := outbox.CheckMigrated(ctx, pool, o.schema); err != nil {
			return err
		}
	}
	if o.consumer != "" {
		if err := e.knownConsumer(ctx); err != nil {
			return err
		}
	}
	return h(ctx, e)
}

// knownConsumer fails with exit code 3 when -consumer names a consumer
// that has nothing in the schema: no letters, parked records, positions,
// processed keys or running member. An empty answer would look like a
// healthy consumer, and a request to it would wait for ever.
func (e *env) knownConsumer(ctx context.Context) error {
	names, err := e.reads.Consumers(ctx)
	if err != nil {
		return err
	}
	members, err := e.reads.Members(ctx, e.consumer)
	if err != nil {
		return err
	}
	if slices.Contains(names, e.consumer) || len(members) > 0 {
		return nil
	}
	known := "none"
	if len(names) > 0 {
		known = strings.Join(names[:min(len(names), 10)], ", ")
	}
	return withCode(exitNotFound, fmt.Errorf("consumer %q has nothing in schema %s and no process runs it; known consumers: %s", e.consumer, e.schema, known))
}

// env is what a command runs with.
type env struct {
	// pool is the database, nil when the command runs on one shard of a
	// fleet: the commands that read use db.
	pool *pgxpool.Pool
	// db is pool, or the shard's one connection in a fleet.
	db outbox.DB
	// reads is the consumer tables' Inspector in pool and -schema.
	reads *consumer.Inspector
	*opts
	out io.Writer
	cmd string
	// answer, when the command runs on one shard of a fleet, keeps its
	// table or JSON value instead of writing them to out.
	answer *shardAnswer
}

// handlers are the commands that need the database, by name.
var handlers = map[string]func(context.Context, *env) error{
	"migrate":         migrate,
	"health":          health,
	"dead list":       deadList,
	"dead replay":     deadResolve,
	"dead discard":    deadResolve,
	"consumers":       consumers,
	"letters list":    lettersList,
	"letters show":    letterShow,
	"letters replay":  lettersAct,
	"letters discard": lettersAct,
	"gaps list":       gapsList,
	"gaps resolve":    gapResolve,
	"requests":        requests,
	"requests cancel": requestCancel,
	"dashboard":       serveDashboard,
	"moves":           movesList,
}

// serveDashboard serves the dashboard read-only on -listen until interrupted.
func serveDashboard(ctx context.Context, e *env) error {
	return dashboardCmd(ctx, e.pool, e.schema, e.listen, e.out)
}
