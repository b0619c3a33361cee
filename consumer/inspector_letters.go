package consumer

import (
	"context"

	"github.com/d419a114/outbox/deadletter"
)

// Letters returns one page of the dead letters that opts (nil: all)
// matches, of every consumer unless opts.Consumer names one, lowest id
// first: at most opts.Limit (default 100); the next page starts after the
// last letter's ID (opts.AfterID). With opts.Brief each letter holds only
// the first 256 bytes of its key, value and error and no headers or
// stack, so that a page's memory is bounded whatever the records hold. A
// Status or Reason that is not one of package deadletter's constants is
// refused.
func (in *Inspector) Letters(ctx context.Context, opts *deadletter.ListOpts) ([]*deadletter.Letter, error) {
	return in.letters.List(ctx, in.db, opts)
}

// Letter returns the dead letter id whole, whatever its consumer and
// status, or an error wrapping outbox.ErrNotFound.
func (in *Inspector) Letter(ctx context.Context, id int64) (*deadletter.Letter, error) {
	return in.letters.Get(ctx, in.db, id)
}

// PeekLetter is Letter for a page that shows a letter to a person: it
// reads at most 64 KiB of the record's key, value and stack and of each of
// its first 100 headers, and 16,384 characters of the error, so that one
// hostile record cannot exhaust the process that shows it.
// Letter.ValueSize is the value's whole size.
func (in *Inspector) PeekLetter(ctx context.Context, id int64) (*deadletter.Letter, error) {
	return in.letters.Peek(ctx, in.db, id)
}

// MatchLetters returns the letters that opts matches (AfterID ignored; at
// most opts.Limit, default 1,000,000) in the order an operator acting on
// many should take them: aggregate by aggregate, each aggregate's letters
// in sequence order, so that replaying one releases the records parked up
// to the next; the unsequenced letters last.
func (in *Inspector) MatchLetters(ctx context.Context, opts *deadletter.ListOpts) ([]deadletter.Ref, error) {
	return in.letters.Match(ctx, in.db, opts)
}

// PreviewLetters counts what the letters that opts matches (AfterID
// ignored) would touch if replayed or discarded, reading at most
// opts.Limit letters (default 1,000,000), for an operator's dry run.
func (in *Inspector) PreviewLetters(ctx context.Context, opts *deadletter.ListOpts) (deadletter.Preview, error) {
	return in.letters.Preview(ctx, in.db, opts)
}

// Failures groups consumer's newest deadletter.FailureScan open letters by
// Letter.Failure, largest group first, at most limit groups (default
// 100). A group's Count counts its letters among those; PreviewLetters
// with a Failure filter counts them all.
func (in *Inspector) Failures(ctx context.Context, consumer string, limit int) ([]deadletter.Failure, error) {
	return in.letters.Failures(ctx, in.db, consumer, limit)
}
