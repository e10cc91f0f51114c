-- Business schema of the sample settlement service. Stepwise's own tables (stepwise_*) and
-- River's come from migrations.Migrate; these are the tables a payments team would own.
--
-- Foreign keys and the hot path. settlement and ledger_entry deliberately carry no foreign
-- key. The settle step bulk-inserts into them right after they were created (tests and the
-- demo start on fresh databases), and Postgres plans the referential check of a foreign key
-- once per session and caches it: planned while the referenced table looks empty it is a
-- sequential scan, and every later check scans a table that keeps growing (measured when the
-- settle step's overhead was benchmarked: 3,000 instead of 13,800 merchants/s). Integrity holds by construction instead: a
-- settlement is inserted only from a merchant row read in the same statement, and ledger
-- entries only from the settlement rows that statement RETURNs, so neither can reference a
-- row that does not exist. The invariants command checks it afterwards. card_txn keeps its
-- foreign key to merchant: it is written by the seed, off the hot path, after merchant has
-- been analyzed.

-- merchant_shard is workflow.ShardOf in SQL: the 64-bit FNV-1a hash of the merchant's code,
-- stored as the bits of a signed bigint, taken as unsigned modulo n. 2^64 mod n is computed
-- as ((2^32 mod n)^2) mod n so nothing overflows. A test pins it to ShardOf.
CREATE OR REPLACE FUNCTION merchant_shard(h bigint, n integer) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
	SELECT ((((h % n) + n) % n
		+ CASE WHEN h < 0 THEN ((4294967296 % n) * (4294967296 % n)) % n ELSE 0 END) % n)::integer
$$;

CREATE TABLE IF NOT EXISTS merchant (
	-- Dense ids in seed order: the settle step's cursor is the last merchant id it walked past.
	id           bigint      PRIMARY KEY,
	-- The business key ("M000042"); shards are derived from it, never from id, so that a
	-- merchant keeps its shard whatever ids a migration gives it.
	code         text        NOT NULL UNIQUE CHECK (code ~ '^M[0-9]{6,}$'),
	shard_hash   bigint      NOT NULL,
	name         text        NOT NULL,
	-- The payee account at the bank. Accounts starting with "closed-" are declined.
	bank_account text        NOT NULL,
	created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS card_txn (
	id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	merchant_id   bigint      NOT NULL REFERENCES merchant (id),
	business_date date        NOT NULL,
	-- The settlement type: card-present or e-commerce, settled and paid out separately.
	type          text        NOT NULL CHECK (type IN ('pos', 'ecom')),
	currency      text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
	-- Minor units (cents; yen for JPY). Money is never a float.
	amount        bigint      NOT NULL CHECK (amount > 0),
	at            timestamptz NOT NULL
);
-- The settle step's only read: one merchant's transactions of one date, summed per type and
-- currency, answered from the index alone.
CREATE INDEX IF NOT EXISTS card_txn_settle_idx ON card_txn (merchant_id, business_date)
	INCLUDE (type, currency, amount);
CREATE INDEX IF NOT EXISTS card_txn_date_idx ON card_txn (business_date);

CREATE TABLE IF NOT EXISTS settlement (
	id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	merchant_id  bigint      NOT NULL,
	settle_date  date        NOT NULL,
	type         text        NOT NULL,
	currency     text        NOT NULL,
	amount       bigint      NOT NULL CHECK (amount > 0),
	txn_count    integer     NOT NULL CHECK (txn_count > 0),
	-- PENDING: created, its payout waits in the operation ledger (PENDING or RETRYABLE);
	-- PAYOUT_SENT: the payout left and its outcome is not proven yet (UNKNOWN_EXTERNAL);
	-- PAID / PAYOUT_FAILED: the bank confirmed or declined it (SUCCEEDED / FAILED_PERMANENT);
	-- NEEDS_REVIEW: a person must decide (MANUAL).
	-- Moved only by the payout's outcome callback, in the transaction that moves the ledger.
	status       text        NOT NULL DEFAULT 'PENDING'
	             CHECK (status IN ('PENDING', 'PAYOUT_SENT', 'PAID', 'PAYOUT_FAILED', 'NEEDS_REVIEW')),
	-- The run that created it (settle/<date>/<shard> or the schedule's key), for audits.
	run_key      text,
	external_ref text,
	created_at   timestamptz NOT NULL DEFAULT now(),
	updated_at   timestamptz NOT NULL DEFAULT now(),
	-- The business key: a retried, replayed or concurrent step can never settle a merchant's
	-- day twice (ON CONFLICT DO NOTHING), whatever the scheduler did.
	UNIQUE (merchant_id, settle_date, type, currency)
);
CREATE INDEX IF NOT EXISTS settlement_date_idx ON settlement (settle_date, status);

-- Double-entry postings. Each settlement posts a debit to the merchant's payable and a credit
-- to the bank clearing account, amount signed (debit positive, credit negative), so that
-- every currency sums to zero; a declined payout posts the reversing pair.
CREATE TABLE IF NOT EXISTS ledger_entry (
	id            bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	settlement_id bigint      NOT NULL,
	entry         text        NOT NULL CHECK (entry IN ('settle', 'reverse')),
	account       text        NOT NULL,
	currency      text        NOT NULL,
	amount        bigint      NOT NULL CHECK (amount <> 0),
	posted_at     timestamptz NOT NULL DEFAULT now(),
	UNIQUE (settlement_id, entry, account)
);

-- A business date's close and reconciliation (docs/design.md, "Waits in the sample"). Each
-- settle run of the date, after its last batch, waits for its payouts to be at rest
-- (workflow.WaitForOperations) and then records its shard here; the run that records the
-- last shard closes the date in the same transaction, under this row's lock, and only after
-- checking again that every payout of the date is SUCCEEDED or FAILED_PERMANENT.
CREATE TABLE IF NOT EXISTS settlement_day (
	settle_date    date        PRIMARY KEY,
	shards         integer     NOT NULL CHECK (shards > 0),
	-- Set when a shard's wait for its payouts timed out with some still not at rest (a
	-- payout MANUAL or UNKNOWN_EXTERNAL for hours): the date is overdue, its runs keep waiting.
	overdue_at     timestamptz,
	-- Set once, by the closing step: every payout of the date proven.
	closed_at      timestamptz,
	-- The day's settlement report, per currency, written by the closing step.
	report         jsonb,
	-- The reconciliation run's result, once the bank's statement arrived (a signal).
	statement_id   text,
	reconciled_at  timestamptz,
	statement_match boolean,
	differences    integer,
	CHECK (closed_at IS NOT NULL OR reconciled_at IS NULL)
);

-- The shards of a date whose payouts are at rest, each recorded by its own run.
CREATE TABLE IF NOT EXISTS settlement_day_shard (
	settle_date date        NOT NULL,
	shard       integer     NOT NULL,
	run_key     text        NOT NULL,
	at_rest_at  timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (settle_date, shard)
);

-- Each currency's reconciliation of a date, by its own run (a child of reconcile/<date>).
CREATE TABLE IF NOT EXISTS settlement_day_currency (
	settle_date     date        NOT NULL,
	currency        text        NOT NULL,
	statement_match boolean     NOT NULL,
	differences     integer     NOT NULL,
	reconciled_at   timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (settle_date, currency)
);

-- From which business date payouts are keyed date first with dated ids (PayoutKey, PayoutID);
-- dates before it keep <merchant>/<date>/… keys and OperationID's ids (LegacyPayoutKey). Every
-- settle step reads it in its own transaction (settleSQL), so that a date is settled under one
-- scheme whichever build and process settles it: a step whose commit a failover lost runs
-- again and must name its payouts as the bank may already have them.
--
-- Recorded once. A new database dates every payout. A database a build from before dated ids
-- has used (settlements, payouts or settle runs in it) dates them from the day after the latest
-- of: three days after today in UTC (the business date of any zone, UTC-12 to UTC+14, is at
-- most a day off it), the latest date settled, and the latest date a settle run was started
-- for (a date settled ahead). Dates more than a year ahead, and run inputs that are no date,
-- count as mistakes, not as dates in progress. Never rewritten: the triggers below refuse it,
-- and recording it again on a ledger that already holds dated payouts is refused too (restore
-- the row from a backup instead).
CREATE TABLE IF NOT EXISTS payout_scheme (
	one        boolean PRIMARY KEY DEFAULT true CHECK (one),
	dated_from date    NOT NULL CHECK (isfinite(dated_from))
);
-- payout_scheme_date reads a settle run's input date, or NULL for anything that is not a
-- plausible date, so that one malformed run cannot make the schema fail to apply.
CREATE OR REPLACE FUNCTION payout_scheme_date(s text) RETURNS date LANGUAGE plpgsql AS $$
DECLARE
	d date;
BEGIN
	IF s IS NULL OR s !~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$' THEN
		RETURN NULL;
	END IF;
	d := s::date;
	IF d > (now() AT TIME ZONE 'UTC')::date + 366 THEN
		RETURN NULL;
	END IF;
	RETURN d;
EXCEPTION WHEN others THEN
	RETURN NULL;
END $$;
CREATE OR REPLACE FUNCTION payout_scheme_is_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'payout_scheme is fixed once recorded: another date would give the payouts of a date settled under one scheme the other scheme''s ids';
END $$;
DO $$
BEGIN
	IF NOT EXISTS (SELECT 1 FROM payout_scheme) THEN
		IF EXISTS (SELECT 1 FROM stepwise_operation WHERE kind = 'payout' AND substr(operation_id::text, 15, 1) = '8') THEN
			RAISE EXCEPTION 'payout_scheme has no row, but the ledger holds payouts with dated ids: restore the row (the first business date of dated payouts) from a backup; recording a new date would settle a date under two schemes';
		END IF;
		INSERT INTO payout_scheme (dated_from)
		SELECT CASE
			WHEN EXISTS (SELECT 1 FROM settlement)
				OR EXISTS (SELECT 1 FROM stepwise_operation WHERE kind = 'payout')
				OR EXISTS (SELECT 1 FROM stepwise_run WHERE workflow = 'settle_merchants')
			THEN greatest((now() AT TIME ZONE 'UTC')::date + 3,
				(SELECT max(settle_date) FROM settlement WHERE settle_date <= (now() AT TIME ZONE 'UTC')::date + 366),
				(SELECT max(payout_scheme_date(input->>'date')) FROM stepwise_run WHERE workflow = 'settle_merchants')) + 1
			ELSE date '0001-01-01' END;
	END IF;
	-- Created once: dropping and creating them at every start would lock the table against the
	-- settle steps that read it.
	IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'payout_scheme'::regclass AND tgname = 'payout_scheme_is_fixed') THEN
		CREATE TRIGGER payout_scheme_is_fixed BEFORE UPDATE OR DELETE ON payout_scheme
			FOR EACH ROW EXECUTE FUNCTION payout_scheme_is_fixed();
	END IF;
	IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = 'payout_scheme'::regclass AND tgname = 'payout_scheme_is_fixed_truncate') THEN
		CREATE TRIGGER payout_scheme_is_fixed_truncate BEFORE TRUNCATE ON payout_scheme
			FOR EACH STATEMENT EXECUTE FUNCTION payout_scheme_is_fixed();
	END IF;
END $$;
