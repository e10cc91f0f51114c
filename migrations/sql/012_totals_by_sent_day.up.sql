-- Totals (reconcile.CompareTotals and the console's Totals page) compare a kind's SUCCEEDED
-- operations of a day with the external system's statement of that day. The statement dates
-- an effect by when the external system applied it, which happens while a request is on the
-- wire; the ledger's closest record of that moment is when the operation's last request began
-- (last_sent_at) or, when its dispatcher died holding the claim and the reconciler proved the
-- outcome later, when that claim was taken (claimed_at; last_sent_at then still names an
-- earlier request, or nothing). greatest() of the two is that moment: a recorded request
-- begins after its own claim, and a lost claim is later than every request before it.
--
-- Without this index a Totals of one day reads every SUCCEEDED operation of the kind ever
-- written. With it a day is one range; partial, so only finished payouts pay for it, once.
-- The two underlying columns are included because PostgreSQL plans an index-only scan of an
-- expression only when the columns it is computed from are in the index as well; the rest
-- is what a comparison reads (key, amount, currency), so a settled day is read without
-- touching the table.
--
-- IF NOT EXISTS: on a large existing ledger, build it beforehand with CREATE INDEX
-- CONCURRENTLY under the same name (this migration runs in one transaction, and a plain
-- CREATE INDEX blocks writes to the table while it builds).
CREATE INDEX IF NOT EXISTS stepwise_operation_totals_idx ON stepwise_operation
    (kind, (greatest(last_sent_at, claimed_at)))
    INCLUDE (operation_id, currency, amount, last_sent_at, claimed_at)
    WHERE state = 'SUCCEEDED';
