package producer

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/d419a114/outbox/internal/backoff"
	"github.com/d419a114/outbox/internal/tables"
)

// listen keeps a LISTEN session open and sends on wake for every
// notification, and once after each (re)connect, since notifications sent
// while it was away are lost. Notifications are hints: the poll in Run is
// what guarantees progress. It returns when ctx ends.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	signal := func() {
		select {
		case wake <- struct{}{}:
		default: // a wake-up is already pending; one is enough
		}
	}
	failures := 0
	for ctx.Err() == nil {
		err := r.listenOnce(ctx, signal, func() { failures = 0 })
		if ctx.Err() != nil {
			return
		}
		failures++
		if r.trace.listener != nil {
			r.trace.listener.TraceListener(ctx, false, err)
		}
		r.log.WarnContext(ctx, "relay: listener lost its connection, reconnecting; polling continues meanwhile",
			slog.String("error", err.Error()), slog.Int("failures", failures))
		r.sleep(ctx, nil, r.retry.Delay(failures))
	}
}

func (r *Relay) listenOnce(ctx context.Context, signal, connected func()) error {
	conn, err := pgx.ConnectConfig(ctx, r.cfg.SessionConfig)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, r.sql.Listen); err != nil {
		return err
	}
	connected()
	if r.trace.listener != nil {
		r.trace.listener.TraceListener(ctx, true, nil)
	}
	signal()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		signal()
	}
}

// sharedListener is the LISTEN session a Fleet holds on one server: it
// listens on the wake channel of every schema of the server's shards and
// wakes the shards of the schema notified. A shard that joins makes it
// reconnect with one channel more (and, as after any connect, wake every
// shard, since notifications sent meanwhile are lost); one that leaves is
// only forgotten.
type sharedListener struct {
	cfg   *pgx.ConnConfig
	log   *slog.Logger
	retry backoff.Policy
	// mu guards wakes, which add and remove change from the shards'
	// goroutines and run reads.
	mu sync.Mutex
	// wakes are the shards' wake channels by the wake channel's name.
	wakes map[string][]chan<- struct{}
	// joined is signalled when a channel was added.
	joined chan struct{}
}

func newSharedListener(cfg *pgx.ConnConfig, log *slog.Logger, retry backoff.Policy) *sharedListener {
	return &sharedListener{cfg: cfg, log: log, retry: retry, wakes: map[string][]chan<- struct{}{}, joined: make(chan struct{}, 1)}
}

// add routes the schema's notifications to wake from now on.
func (l *sharedListener) add(schema string, wake chan<- struct{}) {
	ch := tables.WakeChannel(schema)
	l.mu.Lock()
	_, had := l.wakes[ch]
	l.wakes[ch] = append(l.wakes[ch], wake)
	l.mu.Unlock()
	if !had {
		select {
		case l.joined <- struct{}{}:
		default:
		}
	}
	signalWake(wake)
}

// remove stops routing the schema's notifications to wake.
func (l *sharedListener) remove(schema string, wake chan<- struct{}) {
	ch := tables.WakeChannel(schema)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.wakes[ch] = slices.DeleteFunc(l.wakes[ch], func(w chan<- struct{}) bool { return w == wake })
	if len(l.wakes[ch]) == 0 {
		delete(l.wakes, ch)
	}
}

// wake signals the shards listening on ch; every shard when ch is empty.
func (l *sharedListener) wake(ch string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for c, wakes := range l.wakes {
		if ch == "" || c == ch {
			for _, w := range wakes {
				signalWake(w)
			}
		}
	}
}

func signalWake(wake chan<- struct{}) {
	select {
	case wake <- struct{}{}:
	default: // a wake-up is already pending; one is enough
	}
}

// errJoined ends a LISTEN session so that it reconnects with a new channel.
var errJoined = errors.New("relay: a shard joined")

// run keeps the LISTEN session open until ctx ends. Notifications are
// hints: each shard's poll guarantees progress while it is down.
func (l *sharedListener) run(ctx context.Context) {
	failures := 0
	for ctx.Err() == nil {
		err := l.once(ctx, func() { failures = 0 })
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errJoined) {
			continue
		}
		failures++
		l.log.WarnContext(ctx, "relay fleet: listener lost its connection, reconnecting; the shards poll meanwhile",
			slog.String("error", err.Error()), slog.Int("failures", failures))
		t := time.NewTimer(l.retry.Delay(failures))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

func (l *sharedListener) once(ctx context.Context, connected func()) error {
	select {
	case <-l.joined: // the channels are read below
	default:
	}
	l.mu.Lock()
	var listen strings.Builder
	for ch := range l.wakes {
		listen.WriteString(tables.ListenTo(ch) + ";")
	}
	l.mu.Unlock()
	conn, err := pgx.ConnectConfig(ctx, l.cfg)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if listen.Len() > 0 {
		if _, err := conn.Exec(ctx, listen.String()); err != nil {
			return err
		}
	}
	connected()
	l.wake("")
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-l.joined:
			cancel()
		case <-wctx.Done():
		}
	}()
	defer func() {
		cancel()
		<-watched
	}()
	for {
		n, err := conn.WaitForNotification(wctx)
		if err != nil {
			if ctx.Err() == nil && wctx.Err() != nil {
				return errJoined
			}
			return err
		}
		l.wake(n.Channel)
	}
}
