package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/d419a114/outbox"
	"github.com/d419a114/outbox/dedupe"
)

// opts are the command line's flags; each command reads those it takes.
type opts struct {
	database, schema, format string
	partition, roles         bool
	status                   string
	consumer, topic, reason  string
	aggType, aggID, failure  string
	since, until             string
	after                    int64
	limit                    int
	group, all, dryRun       bool
	rate                     float64
	wait                     time.Duration
	by, listen               string
	keyRetention             time.Duration
	// databases are the -database flags; database is the one the command
	// runs on.
	databases databaseList
	// fleetFile, shard and shardTimeout are -fleet, -shard and
	// -shard-timeout.
	fleetFile, shard string
	shardTimeout     time.Duration
	// from, to, moveID, aggregates, aggregatesFile and allowNew are the
	// move commands' -from, -to, -id, -aggregate (repeated), -aggregates
	// and -allow-new.
	from, to, moveID, aggregatesFile string
	aggregates                       stringList
	allowNew                         bool
	// set are the flags the command line gave.
	set map[string]bool
	// args are the positional arguments, wherever they stood among the
	// flags.
	args []string
}

// filterFlags choose letters: every letters command but show takes them.
var filterFlags = []string{"consumer", "topic", "aggregate-type", "aggregate-id", "reason", "failure", "since", "until"}

// flagsOf are the flags of each command beyond -database and -schema,
// which every command takes: a flag another command takes is refused, so
// that a filter given to the wrong command cannot be silently ignored.
var flagsOf = map[string][]string{
	"migrate":         {"partition-by-day", "fleet", "shard"},
	"sql":             {"roles"},
	"health":          append([]string{"o"}, readFleetFlags...),
	"dead list":       append([]string{"status", "aggregate-type", "aggregate-id", "limit", "o"}, readFleetFlags...),
	"dead replay":     {"by", "fleet", "shard"},
	"dead discard":    {"by", "fleet", "shard"},
	"consumers":       append([]string{"key-retention", "o"}, readFleetFlags...),
	"letters list":    append(append([]string{"status", "after", "limit", "group", "o"}, filterFlags...), readFleetFlags...),
	"letters show":    {"o", "fleet", "shard"},
	"letters replay":  append([]string{"all", "dry-run", "rate", "wait", "by", "fleet", "shard"}, filterFlags...),
	"letters discard": append([]string{"all", "dry-run", "rate", "wait", "by", "fleet", "shard"}, filterFlags...),
	"gaps list":       append([]string{"consumer", "aggregate-type", "aggregate-id", "limit", "o"}, readFleetFlags...),
	"gaps resolve":    {"consumer", "aggregate-type", "aggregate-id", "dry-run", "wait", "by", "fleet", "shard"},
	"requests":        append([]string{"consumer", "limit", "o"}, readFleetFlags...),
	"requests cancel": {"by", "fleet", "shard"},
	"dashboard":       {"listen", "fleet", "shard"},
	"moves":           append([]string{"limit", "o"}, readFleetFlags...),
	"move start":      append([]string{"aggregate", "aggregates", "id", "allow-new"}, moveFlags...),
	"move resume":     moveFlags,
	"move status":     append([]string{"o"}, moveFlags...),
}

// moveFlags are the flags of the move commands: the fleet and its two
// shards.
var moveFlags = []string{"fleet", "from", "to", "shard-timeout"}

// readFleetFlags are the flags of the commands that read a whole fleet.
var readFleetFlags = []string{"fleet", "shard", "shard-timeout"}

// define adds flag name, bound to its field of o, to fs.
func define(fs *flag.FlagSet, o *opts, name string) {
	switch name {
	case "database":
		fs.Var(&o.databases, name, "PostgreSQL connection string (default $DATABASE_URL); repeated, a fleet of one shard each, named N-DBNAME")
	case "fleet":
		fs.StringVar(&o.fleetFile, name, "", "a fleet file (JSON with \"shards\" and \"targets\"); producer commands read its shards, consumer commands its targets")
	case "shard":
		fs.StringVar(&o.shard, name, "", "with -fleet or repeated -database: only this shard")
	case "shard-timeout":
		fs.DurationVar(&o.shardTimeout, name, 10*time.Second, "with a fleet: each shard's bound to connect and answer")
	case "schema":
		fs.StringVar(&o.schema, name, outbox.DefaultSchema, "schema of the outbox tables")
	case "o":
		fs.StringVar(&o.format, name, "table", "output: table or json")
	case "partition-by-day":
		fs.BoolVar(&o.partition, name, false, "create the events table partitioned by day")
	case "roles":
		fs.BoolVar(&o.roles, name, false, "print the least-privilege roles of -schema instead of the migrations")
	case "status":
		fs.StringVar(&o.status, name, "dead", "dead, replayed, discarded or all")
	case "consumer":
		fs.StringVar(&o.consumer, name, "", "the consumer")
	case "topic":
		fs.StringVar(&o.topic, name, "", "only letters of this topic")
	case "aggregate-type":
		fs.StringVar(&o.aggType, name, "", "only this aggregate type")
	case "aggregate-id":
		fs.StringVar(&o.aggID, name, "", "only this aggregate id")
	case "reason":
		fs.StringVar(&o.reason, name, "", "only letters with this reason: "+reasonNames())
	case "failure":
		fs.StringVar(&o.failure, name, "", "only letters with this failure fingerprint")
	case "since":
		fs.StringVar(&o.since, name, "", "only letters that first failed since then (a duration ago, or an RFC 3339 time)")
	case "until":
		fs.StringVar(&o.until, name, "", "only letters that first failed before then (a duration ago, or an RFC 3339 time)")
	case "after":
		fs.Int64Var(&o.after, name, 0, "page: only ids above this one")
	case "limit":
		fs.IntVar(&o.limit, name, 100, "at most this many rows")
	case "group":
		fs.BoolVar(&o.group, name, false, "group the open letters by failure fingerprint")
	case "all":
		fs.BoolVar(&o.all, name, false, "act on every open letter of the consumer")
	case "dry-run":
		fs.BoolVar(&o.dryRun, name, false, "count what the action would touch, do nothing")
	case "rate":
		fs.Float64Var(&o.rate, name, 0, "at most this many letters per second; 0 is no bound")
	case "wait":
		fs.DurationVar(&o.wait, name, 0, "wait this long for the consumer to finish the request")
	case "by":
		fs.StringVar(&o.by, name, whoami(), "who asks, for the audit log")
	case "key-retention":
		fs.DurationVar(&o.keyRetention, name, dedupe.DefaultRetention, "the consumers' Config.KeyRetention")
	case "from":
		fs.StringVar(&o.from, name, "", "the shard the aggregates leave")
	case "to":
		fs.StringVar(&o.to, name, "", "the shard the aggregates go to")
	case "id":
		fs.StringVar(&o.moveID, name, "", "the move's id; a move under way with this id continues (default: a new one)")
	case "aggregate":
		fs.Var(&o.aggregates, name, "an aggregate to move, TYPE/ID; repeated")
	case "aggregates":
		fs.StringVar(&o.aggregatesFile, name, "", "a file of aggregates to move, one TYPE/ID per line")
	case "allow-new":
		fs.BoolVar(&o.allowNew, name, false, "also move aggregates the source never numbered (no events there); only for aggregates with no events on any shard")
	case "listen":
		fs.StringVar(&o.listen, name, "127.0.0.1:8080", "address to serve on")
	default:
		panic("outbox: no flag " + name) // flagsOf names only flags defined here
	}
}

// flagSet is cmd's own flag set: -database, -schema and the flags cmd
// takes, each with its default.
func flagSet(cmd string, o *opts) *flag.FlagSet {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.format, o.limit, o.keyRetention, o.shardTimeout = "table", 100, dedupe.DefaultRetention, 10*time.Second
	for _, name := range append([]string{"database", "schema"}, flagsOf[cmd]...) {
		define(fs, o, name)
	}
	return fs
}

// commandHelp is cmd's help: its lines of the usage, then its flags.
func commandHelp(cmd string) string {
	var b strings.Builder
	b.WriteString("usage:\n")
	for _, line := range strings.Split(usage, "\n") {
		if strings.HasPrefix(line, "  outbox "+cmd) {
			b.WriteString(line + "\n")
		}
	}
	o := &opts{}
	fs := flagSet(cmd, o)
	fs.SetOutput(&b)
	fs.PrintDefaults()
	return b.String()
}

func parse(cmd string, args []string) (*opts, error) {
	if _, ok := flagsOf[cmd]; !ok {
		return nil, usageError("unknown command %q", cmd)
	}
	o := &opts{}
	fs := flagSet(cmd, o)
	positional, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return nil, err
	}
	if err != nil {
		return nil, usageError("%s: %v%s", cmd, err, otherwise(cmd, err))
	}
	if o.format != "table" && o.format != "json" {
		return nil, usageError("%s: -o %q: want table or json", cmd, o.format)
	}
	if o.keyRetention <= 0 {
		return nil, usageError("%s: -key-retention %s: want a positive duration", cmd, o.keyRetention)
	}
	o.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { o.set[f.Name] = true })
	switch {
	case len(o.databases) == 0:
		o.database = os.Getenv("DATABASE_URL")
	case len(o.databases) == 1:
		o.database = o.databases[0]
	case fs.Lookup("fleet") == nil:
		return nil, usageError("%s: -database given %d times: %s runs on one database", cmd, len(o.databases), cmd)
	}
	if o.shard != "" && o.fleetFile == "" && len(o.databases) < 2 {
		return nil, usageError("%s: -shard names a shard of -fleet FILE or of repeated -database; give one of them", cmd)
	}
	if o.shardTimeout <= 0 {
		return nil, usageError("%s: -shard-timeout %s: want a positive duration", cmd, o.shardTimeout)
	}
	if o.status == "all" {
		o.status = ""
	}
	if o.by == "" && fs.Lookup("by") != nil {
		return nil, usageError("%s: -by NAME: who acts, for the audit log ($USER is not set)", cmd)
	}
	o.args = positional
	return o, nil
}

// otherwise says, for a flag cmd does not take, which commands take it.
func otherwise(cmd string, err error) string {
	const prefix = "flag provided but not defined: -"
	msg := err.Error()
	if !strings.HasPrefix(msg, prefix) {
		return ""
	}
	name := strings.TrimPrefix(msg, prefix)
	var takers []string
	for c, names := range flagsOf {
		for _, n := range names {
			if n == name {
				takers = append(takers, c)
			}
		}
	}
	if len(takers) == 0 {
		return ""
	}
	sort.Strings(takers)
	return fmt.Sprintf(" (%s does not take -%s; %s do)", cmd, name, strings.Join(takers, ", "))
}

// parseInterspersed parses args with fs, flags before, between and after
// the positional arguments (letters replay 42 -wait 30s), and returns the
// positional ones; "--" ends the flags.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}
