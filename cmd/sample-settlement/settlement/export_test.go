package settlement

// SchemaSQL exposes the embedded schema to the tests, which name their template database
// after its hash so a changed schema gets a new template.
var SchemaSQL = schemaSQL
