package operator

import "context"

type actorKey struct{}

// WithActor returns ctx naming who acts, for the audit rows of the actions
// taken with it: a Submit's requested_by, and the actor of a
// consumer.Processor's Replay, Discard or ResolveGap called directly.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

// DefaultActor names an actor no WithActor named.
const DefaultActor = "api"

// Actor returns who acts with ctx, DefaultActor when WithActor named
// nobody.
func Actor(ctx context.Context) string {
	if a, _ := ctx.Value(actorKey{}).(string); a != "" {
		return a
	}
	return DefaultActor
}
