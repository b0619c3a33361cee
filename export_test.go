package outbox

// MigrationList exposes the numbered migrations to the tests.
var MigrationList = migrationList
