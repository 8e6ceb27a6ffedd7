-- tests/bench/app_keys.sql - idempotency done in the application: the
-- ceiling idemproxy is measured against (issue 22, tests/bench/keyed.sh
-- row "app"). Per request one INSERT that claims the key and one UPDATE
-- that stores the response, each its own implicit transaction (two round
-- trips, two commits), no NOTIFY: the shape of brandur's atomic phases and
-- of the django / express / Spring middlewares. One plain table with a
-- primary key (keyed.sh creates app_keys in database bench); the bytes
-- stored are idemproxy's own for the same request (-D status, headers,
-- body, fp).
\set k random(1, 9000000000000000000)
INSERT INTO app_keys (scope, key, fingerprint, state, locked_until) VALUES (:scope, :k, :fp, 'in_flight', now() + CAST(:lease AS bigint) * interval '1 millisecond') ON CONFLICT DO NOTHING;
UPDATE app_keys SET state = 'completed', status = CAST(:status AS int), headers = :headers, body = :body, locked_until = NULL WHERE scope = :scope AND key = :k;
