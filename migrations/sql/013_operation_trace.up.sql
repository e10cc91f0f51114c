-- The W3C traceparent of the workflow step (or other traced caller) that enqueued the
-- operation, written by outbox.Enqueue from its context. A send and a reconciler check happen
-- later, in other traces; their spans link back to this one, so "where did the time go from
-- the step to the bank's answer" is one trace search. NULL when the caller was not traced.
-- A traceparent is 55 characters; the bound keeps a damaged caller from storing a document.
ALTER TABLE stepwise_operation ADD COLUMN trace_parent text CHECK (char_length(trace_parent) <= 128);
