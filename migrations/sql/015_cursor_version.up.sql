-- Rolling deploys (package workflow, docs/design.md "Rolling deploys and cursor versions").
--
-- cursor_version is the version of the committed cursor's shape, as the stepper that wrote it
-- declared it (workflow.CursorVersioner; 1 by default). It is a column of its own, written by
-- the same fenced UPDATE that writes the cursor, rather than an envelope around the cursor:
-- the cursor column holds the stepper's JSON as it is, and the console, the stepwise CLI and
-- harness oracles read its fields in SQL (cursor->>'...'). DEFAULT 1 (no table rewrite on
-- PostgreSQL 11+): every cursor committed before versions existed is version 1, and so is
-- any cursor a binary without versions commits.
ALTER TABLE stepwise_checkpoint ADD COLUMN cursor_version integer NOT NULL DEFAULT 1 CHECK (cursor_version >= 1);

-- awaits_cursor_version is set when a worker met a committed cursor newer than its stepper
-- reads (an old worker during a rolling deploy) and released the run untouched: the run waits
-- for a worker that reads that version. awaits_since is when that wait began (the release
-- back-off grows with it). Both are cleared by the next claim of a worker that reads the
-- cursor (markRunning) and by a resume. NULL otherwise; no index: read with the run.
ALTER TABLE stepwise_run ADD COLUMN awaits_cursor_version integer, ADD COLUMN awaits_since timestamptz;
