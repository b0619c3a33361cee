package outbox

import "github.com/d419a114/outbox/internal/pgsession"

// ErrNotSession is wrapped by the error of a component whose session
// connection turned out not to be a session of its own: a client of a
// transaction pooler (PgBouncer with pool_mode=transaction or statement),
// which runs each transaction on whichever server session is free. LISTEN
// and session advisory locks need a real session: point the component's
// SessionConfig at the PostgreSQL server directly, or at a session-mode
// pool. The relay's Run returns it (producer.RelayConfig.SessionConfig);
// the consumer logs it and polls for operator requests instead of
// listening (consumer.Config.SessionConfig). Match it with errors.Is.
var ErrNotSession = pgsession.ErrNotSession
